"""Structured output on the client side: the constraint a client asks for (read from files, checked before any
request) and the check of each answer it gets back.

``trtpipe query --json-schema FILE`` and ``trtpipe loadtest run --response-format ... / --tools ...`` use it. A
:class:`Constraint` is what one run asks for, in both wire forms: the Triton models' guided-decoding inputs
(``guided_decoding_guide_type`` / ``guided_decoding_guide``, trtpipe_runtime.grammar.GUIDE_TYPES) and the OpenAI
request fields (``response_format``, ``tools`` / ``tool_choice``). Reading a file is checked the way the server
checks it (xgrammar parses the schema or regex: trtpipe_runtime.grammar.parse_guide; the tools as OpenAI checks
them: pipeline.openai_tools), plus ``jsonschema``'s own check of a schema where it is installed, so a bad file is
one error naming the file and the fix, before a server is started or a request sent.

:func:`check_answer` judges one answer: valid, or one cause (:data:`CAUSES`). ``cut_by_max_tokens`` is kept apart
from the other causes: an answer the grammar kept on track but that ran out of tokens is a max_tokens problem, not
a constraint problem.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from plugins.errors import PipelineError

RESPONSE_FORMATS = ("json_object", "json_schema:FILE")
"""What ``--response-format`` takes."""
TOOL_CHOICES = ("required", "auto", "NAME")
"""What ``--tool-choice`` takes (NAME: one function of the tools file)."""

CAUSES = {
    "cut_by_max_tokens": "the answer ran into max_tokens before it was complete (raise max_tokens)",
    "not_json": "the text is not JSON and holds no complete JSON value",
    "extra_text": "a complete JSON value is in the text, with other text around it (prose, a code fence)",
    "not_an_object": "valid JSON, but not an object (json_object asks for one)",
    "schema_mismatch": "valid JSON that does not validate against the schema (jsonschema)",
    "no_match": "the text does not match the regular expression (Python's re.fullmatch)",
    "no_tool_call": "no tool call was parsed from the answer",
    "wrong_function": "a call of a function other than the one tool_choice names",
    "unknown_function": "a call of a function that is not in the tools",
    "bad_arguments": "a call whose arguments are not a JSON object or do not validate against its parameters",
}
"""Why an answer is not valid, one cause per answer (the first that applies, in this order of checks)."""


class ConstraintError(PipelineError):
    """A constraint file or value that cannot be used: names the file (or flag), what is wrong and the fix."""


def jsonschema_module():
    """The ``jsonschema`` package, or None when it is not installed (answers are then parsed, not validated)."""
    try:
        import jsonschema
    except ImportError:
        return None
    return jsonschema


@dataclass(frozen=True)
class Constraint:
    """What a run constrains its answers with.

    Attributes:
        kind: ``json_object``, ``json_schema``, ``regex`` or ``tools``.
        guide_type: the Triton guide type (``json``, ``json_schema``, ``regex``); None for tools (the OpenAI
            frontend turns a forced call into a schema itself).
        guide: the guide text sent to Triton ('' for ``json``).
        schema: the JSON Schema (json_schema), else None.
        source: the file it was read from (or the flag's value), for messages and reports.
        tools: the OpenAI tools list (kind tools).
        tool_choice: ``required``, ``auto`` or a function name (kind tools).
    """

    kind: str
    guide_type: Optional[str] = None
    guide: str = ""
    schema: Optional[dict] = None
    source: Optional[str] = None
    tools: Optional[list] = None
    tool_choice: Optional[str] = None

    def triton_inputs(self) -> dict:
        """The ensemble's guided-decoding inputs (str values: pipeline.client.build_inputs sends them as BYTES)."""
        if self.guide_type is None:
            raise ConstraintError(f"{self.kind}: not a guided-decoding guide; tools go through the OpenAI frontend "
                                  "(--endpoint openai-chat)")
        out = {"guided_decoding_guide_type": self.guide_type}
        if self.guide:
            out["guided_decoding_guide"] = self.guide
        return out

    def openai_fields(self) -> dict:
        """The OpenAI request-body fields that ask for this constraint."""
        if self.kind == "json_object":
            return {"response_format": {"type": "json_object"}}
        if self.kind == "json_schema":
            name = re.sub(r"[^a-zA-Z0-9_-]", "_", Path(self.source or "schema").stem)[:64] or "schema"
            return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": self.schema}}}
        if self.kind == "regex":
            return {"guided_regex": self.guide}  # vLLM's extension; this frontend takes it too
        choice: Union[str, dict] = self.tool_choice or "auto"
        if choice not in ("required", "auto", "none"):
            choice = {"type": "function", "function": {"name": choice}}
        return {"tools": self.tools, "tool_choice": choice}

    @property
    def function_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools or []]

    def describe(self) -> dict:
        """For reports: what was asked, without the whole tools list."""
        d: dict = {"kind": self.kind, "source": self.source}
        if self.kind == "tools":
            d.update(tool_choice=self.tool_choice, functions=self.function_names)
        else:
            d.update(guide_type=self.guide_type, guide_bytes=len(self.guide.encode("utf-8")))
        d["validated_with"] = "jsonschema" if jsonschema_module() is not None else "json parse only (no jsonschema)"
        return d


# ---- reading the constraint -------------------------------------------------------------------------------------


def read_json_file(path: Union[str, Path], flag: str, what: str) -> tuple[str, Any]:
    """(text, parsed value) of a JSON file; ConstraintError naming ``flag``, the file and the fix when it cannot be
    read or is not JSON (the line and column of the first error)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConstraintError(f"{flag} {p}: no such file: give the path of {what}") from None
    except IsADirectoryError:
        raise ConstraintError(f"{flag} {p}: is a folder, not a file: give the path of {what}") from None
    except UnicodeDecodeError as exc:
        raise ConstraintError(f"{flag} {p}: not UTF-8 text (byte {exc.start}): save {what} as UTF-8") from None
    except OSError as exc:
        raise ConstraintError(f"{flag} {p}: cannot be read ({exc.strerror or exc}): check the path and its "
                              "permissions") from None
    try:
        return text, json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstraintError(f"{flag} {p}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}: "
                              f"fix the file so that it holds {what}") from None


def _server_check(kind: str, text: str, where: str) -> None:
    """The check the runtimes make (xgrammar parses it; the size limit), as a ConstraintError naming ``where``."""
    from trtpipe_runtime.decoding import DecodingError
    from trtpipe_runtime.grammar import parse_guide

    try:
        parse_guide(kind, text)
    except DecodingError as exc:
        raise ConstraintError(f"{where}: the server would refuse it: "
                              f"{str(exc).replace('guided_decoding_guide: ', '')}") from None


def schema_file(path: Union[str, Path], flag: str = "--json-schema") -> Constraint:
    """A ``json_schema`` constraint from a JSON Schema file, checked: readable, JSON, an object, a schema
    ``jsonschema`` accepts (when installed: its metaschema) and one xgrammar compiles.

    Raises:
        ConstraintError: naming the file, what is wrong and the fix.
    """
    text, schema = read_json_file(path, flag, "a JSON Schema object")
    where = f"{flag} {path}"
    if not isinstance(schema, dict):
        raise ConstraintError(f"{where}: holds a JSON {type(schema).__name__}, not a JSON Schema object: write the "
                              "schema as an object, e.g. {\"type\": \"object\", \"properties\": {...}}")
    js = jsonschema_module()
    if js is not None:
        try:
            js.validators.validator_for(schema).check_schema(schema)
        except js.exceptions.SchemaError as exc:
            at = "/".join(str(p) for p in exc.absolute_path) or "the top level"
            raise ConstraintError(f"{where}: not a valid JSON Schema at {at}: {exc.message}: fix the schema") \
                from None
    _server_check("json_schema", text, where)
    return Constraint("json_schema", "json_schema", json.dumps(schema, ensure_ascii=False), schema, str(path))


def regex_constraint(pattern: str, flag: str = "--regex") -> Constraint:
    """A ``regex`` constraint, checked by xgrammar (the server's parser)."""
    if not pattern:
        raise ConstraintError(f"{flag}: empty: give the regular expression the answer must match")
    _server_check("regex", pattern, f"{flag} {pattern!r}")
    return Constraint("regex", "regex", pattern, source=pattern)


def response_format(value: str, flag: str = "--response-format") -> Constraint:
    """``json_object`` or ``json_schema:FILE`` -> the constraint.

    Raises:
        ConstraintError: another value, or a bad schema file.
    """
    v = (value or "").strip()
    if v == "json_object":
        return Constraint("json_object", "json", "", source="json_object")
    if v.startswith("json_schema:") and v[len("json_schema:"):].strip():
        return schema_file(v[len("json_schema:"):].strip(), flag)
    raise ConstraintError(f"{flag} {value!r}: give json_object, or json_schema:FILE with FILE a JSON Schema file")


def tools_file(path: Union[str, Path], tool_choice: Optional[str] = "auto", flag: str = "--tools") -> Constraint:
    """A ``tools`` constraint from an OpenAI tools file (a JSON list of ``{"type": "function", "function":
    {...}}``) and ``tool_choice`` (``required``, ``auto`` or a function's name), checked as the OpenAI frontend
    checks them.

    Raises:
        ConstraintError: naming the file (or --tool-choice), the field, what is wrong and the fix.
    """
    from pipeline.openai_requests import APIError
    from pipeline.openai_tools import validate_tools

    _, tools = read_json_file(path, flag, "an OpenAI tools list ([{\"type\": \"function\", \"function\": {...}}])")
    try:
        validate_tools(tools)
    except APIError as exc:
        raise ConstraintError(f"{flag} {path}: {exc.message}") from None
    choice = tool_choice or "auto"
    names = [t["function"]["name"] for t in tools]
    if choice not in ("required", "auto") and choice not in names:
        raise ConstraintError(f"--tool-choice {choice!r}: not required, auto or a function of {path} "
                              f"({', '.join(names)}): give one of those")
    for t in tools:  # each call's arguments are validated against these: a bad schema would fail every answer
        params = t["function"].get("parameters")
        js = jsonschema_module()
        if params is not None and js is not None:
            try:
                js.validators.validator_for(params).check_schema(params)
            except js.exceptions.SchemaError as exc:
                raise ConstraintError(f"{flag} {path}: function {t['function']['name']!r}: parameters is not a "
                                      f"valid JSON Schema: {exc.message}: fix it") from None
    return Constraint("tools", tools=tools, tool_choice=choice, source=str(path))


# ---- judging answers --------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """One answer's check: ``valid``, else ``cause`` (a key of :data:`CAUSES`) and ``detail`` (the first error)."""

    valid: bool
    cause: Optional[str] = None
    detail: str = ""

    def as_dict(self) -> dict:
        return {"valid": self.valid, "cause": self.cause, "detail": self.detail[:300]}


def _embedded_json(text: str) -> bool:
    """A complete JSON object or array at the top level of ``text`` (after prose or a code fence). Brackets
    opened and never closed (a JSON value cut short) hide what is inside them: the inner object of a cut answer
    is not a complete value of the text."""
    dec = json.JSONDecoder()
    depth, in_string, escape = 0, False, False
    for i, ch in enumerate(text):
        if depth and in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
            continue
        if ch in "{[":
            if depth == 0:
                try:
                    dec.raw_decode(text, i)
                    return True
                except ValueError:
                    pass
            depth += 1
        elif ch in "}]" and depth:
            depth -= 1
        elif ch == '"' and depth:
            in_string = True
    return False


def _schema_error(schema: dict, value: Any) -> Optional[str]:
    js = jsonschema_module()
    if js is None:
        return None
    err = js.exceptions.best_match(js.validators.validator_for(schema)(schema).iter_errors(value))
    if err is None:
        return None
    at = "/".join(str(p) for p in err.absolute_path)
    return f"{'at ' + at + ': ' if at else ''}{err.message}"


def check_json(text: str, schema: Optional[dict] = None, *, object_only: bool = False, cut: bool = False) -> Verdict:
    """Is ``text`` (the whole answer, surrounding whitespace allowed) one JSON value, an object when
    ``object_only``, valid against ``schema`` when given (and jsonschema installed)? ``cut``: the answer
    stopped at max_tokens (a text that does not parse is then ``cut_by_max_tokens`` unless a complete JSON value
    is in it)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        if _embedded_json(text):
            return Verdict(False, "extra_text", f"{exc}")
        return Verdict(False, "cut_by_max_tokens" if cut else "not_json", f"{exc}")
    if object_only and not isinstance(value, dict):
        return Verdict(False, "not_an_object", f"a JSON {type(value).__name__}")
    if schema is not None:
        err = _schema_error(schema, value)
        if err is not None:
            return Verdict(False, "schema_mismatch", err)
    return Verdict(True)


def check_tool_calls(calls: list[dict], c: Constraint, *, cut: bool = False) -> Verdict:
    """OpenAI ``tool_calls`` (each ``{"function": {"name", "arguments": JSON text}}``) against the tools: at least
    one call, each of a known function (the named one, for a named tool_choice), with arguments a JSON object
    that validates against that function's parameters."""
    if not calls:
        return Verdict(False, "cut_by_max_tokens" if cut else "no_tool_call", "no tool_calls in the answer")
    tools = {t["function"]["name"]: t["function"] for t in c.tools or []}
    for call in calls:
        fn = call.get("function") or {}
        name = fn.get("name")
        if name not in tools:
            return Verdict(False, "unknown_function", f"{name!r} is not in the tools")
        if c.tool_choice not in (None, "auto", "required") and name != c.tool_choice:
            return Verdict(False, "wrong_function", f"called {name!r}, tool_choice names {c.tool_choice!r}")
        try:
            args = json.loads(fn.get("arguments") or "")
        except ValueError as exc:
            return Verdict(False, "bad_arguments", f"{name}: arguments are not JSON ({exc})")
        if not isinstance(args, dict):
            return Verdict(False, "bad_arguments", f"{name}: arguments are a JSON {type(args).__name__}")
        params = tools[name].get("parameters")
        err = _schema_error(params, args) if params is not None else None
        if err is not None:
            return Verdict(False, "bad_arguments", f"{name}: {err}")
    return Verdict(True)


def check_answer(c: Constraint, text: str, *, tool_calls: Optional[list] = None, cut: bool = False) -> Verdict:
    """One answer against constraint ``c``."""
    if c.kind == "tools":
        return check_tool_calls(tool_calls or [], c, cut=cut)
    if c.kind == "regex":
        try:
            ok = re.fullmatch(c.guide, text) is not None
        except re.error as exc:  # xgrammar's dialect is not Python's everywhere
            return Verdict(False, "no_match", f"Python's re cannot check this pattern ({exc})")
        return Verdict(True) if ok else Verdict(False, "cut_by_max_tokens" if cut else "no_match", text[:80])
    return check_json(text, c.schema, object_only=c.kind == "json_object", cut=cut)


@dataclass
class Tally:
    """Verdicts over many answers: how many checked, valid, and the failures by cause (with a first example)."""

    checked: int = 0
    valid: int = 0
    by_cause: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)

    def add(self, v: Verdict) -> None:
        self.checked += 1
        if v.valid:
            self.valid += 1
            return
        self.by_cause[v.cause] = self.by_cause.get(v.cause, 0) + 1
        self.examples.setdefault(v.cause, v.detail[:200])

    def as_dict(self) -> dict:
        return {"checked": self.checked, "valid": self.valid,
                "valid_fraction": self.valid / self.checked if self.checked else None,
                "failures_by_cause": dict(sorted(self.by_cause.items(), key=lambda kv: -kv[1])),
                "first_failure_by_cause": self.examples}
