"""Structured output in the OpenAI API -> the Triton models' guided-decoding inputs.

OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema`` with its ``schema``; OpenAI API reference,
"Structured Outputs") and vLLM's request-body extensions (``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``; vLLM docs, "Structured Outputs") become one guide: TensorRT-LLM's Triton inputs
``guided_decoding_guide_type`` / ``guided_decoding_guide`` (trtpipe_runtime.grammar.GUIDE_TYPES), which every
runtime of this project honours. A ``json_schema`` request's inner ``schema`` is what is sent (trtllm-serve 1.2.1
sends the wrapper object instead: tests/facts/trtllm_1_2_1/guided_decoding.json). One guide per request: a
request with two (or a guide and forced tool calls) is refused by name.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple, Optional

from pipeline.openai_errors import APIError

GUIDE_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
"""The request fields that ask for a guide (one at most)."""


class Guide(NamedTuple):
    """The guided-decoding inputs of one request: ``kind`` (json, json_schema, regex, ebnf_grammar) and ``text``."""

    kind: str
    text: str
    field: str
    """The request field it came from (named in errors)."""

    def inputs(self) -> dict:
        """The Triton inputs (tensorrt_llm_bls / ensemble names)."""
        return {"guided_decoding_guide_type": self.kind, "guided_decoding_guide": self.text}


def guide_of(extra: dict) -> Optional[Guide]:
    """The guide a request body's extra fields ask for (``extra``: the fields beyond the common ones), None for
    none (no field, or ``response_format`` ``text``).

    Raises:
        APIError: 400 naming the field: not the shape OpenAI / vLLM define, an unknown response_format type, a
            json_schema without its schema, or several guides in one request.
    """
    asked = [f for f in GUIDE_FIELDS if extra.get(f) is not None]
    guides = [g for g in (_one(f, extra[f]) for f in asked) if g is not None]
    if len(guides) > 1:
        raise APIError(400, f"{guides[1].field}: one structured-output constraint per request, and "
                            f"{guides[0].field} is set too: send one", param=guides[1].field)
    return checked(guides[0]) if guides else None


def checked(guide: Guide) -> Guide:
    """``guide`` after the runtimes' own check (trtpipe_runtime.grammar.parse_guide: xgrammar parses the schema,
    regex or grammar; the size limit), so a bad one is a 400 here, before Triton.

    Raises:
        APIError: 400 naming the guide's request field.
    """
    from trtpipe_runtime.decoding import DecodingError
    from trtpipe_runtime.grammar import parse_guide

    try:
        parse_guide(guide.kind, guide.text)
    except DecodingError as exc:
        message = str(exc).replace("guided_decoding_guide", guide.field, 1)
        raise APIError(400, message if message.startswith(guide.field) else f"{guide.field}: {message}",
                       param=guide.field) from None
    return guide


def _one(field: str, value: Any) -> Optional[Guide]:
    if field == "response_format":
        return _response_format(value)
    if field == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise APIError(400, f"guided_json: not valid JSON ({exc}): send a JSON Schema object",
                               param=field) from None
        if not isinstance(value, dict):
            raise APIError(400, f"guided_json: a JSON Schema is an object, not {type(value).__name__}", param=field)
        return Guide("json_schema", json.dumps(value, ensure_ascii=False), field)
    if field == "guided_choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise APIError(400, "guided_choice: send a non-empty list of non-empty strings", param=field)
        return Guide("regex", "(" + "|".join(re.escape(c) for c in value) + ")", field)
    if not isinstance(value, str) or not value.strip():
        raise APIError(400, f"{field}: send the {'regular expression' if field == 'guided_regex' else 'grammar'} "
                            "as a non-empty string", param=field)
    return Guide("regex" if field == "guided_regex" else "ebnf_grammar", value, field)


def _response_format(fmt: Any) -> Optional[Guide]:
    """OpenAI's response_format object -> a guide (None for ``text``)."""
    if not isinstance(fmt, dict):
        raise APIError(400, f"response_format: {fmt!r} is not an object: send {{\"type\": \"json_object\"}}, "
                            "{\"type\": \"json_schema\", \"json_schema\": {...}} or {\"type\": \"text\"}",
                       param="response_format")
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json", "", "response_format")
    if kind != "json_schema":
        raise APIError(400, f"response_format.type {kind!r}: send text, json_object or json_schema",
                       param="response_format.type")
    wrapper = fmt.get("json_schema")
    if not isinstance(wrapper, dict):
        raise APIError(400, "response_format.json_schema: missing or not an object: send {\"name\": ..., "
                            "\"schema\": {...}}", param="response_format.json_schema")
    schema = wrapper.get("schema")
    if schema is None:
        raise APIError(400, "response_format.json_schema.schema is missing: send the JSON Schema the answer must "
                            "follow", param="response_format.json_schema.schema")
    if not isinstance(schema, dict):
        raise APIError(400, f"response_format.json_schema.schema: a JSON Schema is an object, not "
                            f"{type(schema).__name__}", param="response_format.json_schema.schema")
    return Guide("json_schema", json.dumps(schema, ensure_ascii=False), "response_format")
