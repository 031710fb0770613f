"""Tool calling for the OpenAI-compatible frontend: which format a model calls tools in, reading calls out of
its text (whole or streamed), the JSON schema that forces a call, and the checks on ``tools`` / ``tool_choice``.

Self-contained: nothing here talks to Triton or reads a request body; pipeline.openai_requests and
pipeline.openai_serving wire it in. Every refusal is the frontend's :class:`~pipeline.openai_requests.APIError`
(400, ``param`` the field's dotted path), its message naming the field, the value, the rule and the fix.

The formats (:data:`TOOL_FORMATS`) are those of the models' own chat templates, recognised by a marker the
template contains (:func:`tool_format`), and parsed as vLLM's tool parsers parse them (rules restated in each
entry, no code taken from them):

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call: Qwen2.5 / Qwen3,
  NousResearch Hermes 2 Pro / 3;
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``: Mistral-7B-Instruct-v0.3,
  Mistral-Nemo-Instruct-2407 (no spaces);
- ``llama3_json``: ``{"name": ..., "parameters": {...}}`` as the whole output (``;`` between calls): Llama 3.1 /
  3.2 / 3.3 Instruct's JSON tool calling.

Not read (yet): Mistral's v11+ ``[TOOL_CALLS]name[ARGS]{...}`` (Mistral Small 3.2, Devstral), Llama's pythonic
calls and ``<|python_tag|>`` built-in tools, and other vLLM parsers' formats.

Reading text (:func:`parse_tool_calls`, :class:`ToolCallStream`; one state machine, so a stream split anywhere
gives what the whole text gives): a call that does not parse (bad JSON, no ``name``, arguments that are not an
object) stays content, verbatim, and is never an exception. Content is the text outside the parsed calls, except
that text made only of whitespace next to a call (the newline between two ``<tool_call>`` blocks, the space
after ``[TOOL_CALLS]``'s array) is dropped; with no call at all the text is the content as it came.

Special tokens: ``[TOOL_CALLS]`` (Mistral) and ``<|python_tag|>`` (Llama) are special tokens, so the text must be
detokenized with them kept (``skip_special_tokens`` off, as vLLM does for these parsers). Qwen2.5's ``<tool_call>``
is an added token that is not special and survives either way; check a model's tokenizer before relying on that.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Optional, Union

from pipeline.openai_errors import APIError

# ---- the formats -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolFormat:
    """One tool-call format: how to recognise a template that uses it, how a call looks, what it mirrors."""

    name: str
    markers: tuple[str, ...]
    """Substrings of a chat template: a template containing any of them writes (and so its model reads and
    writes) this format."""
    call_start: Optional[str]
    """The text that opens a call in generated text (``None``: a call is the output's leading JSON object)."""
    example: str
    """One call, as the model writes it."""
    upstream: str
    """The vLLM tool parser (``--tool-call-parser``) whose rules this format's parsing follows."""
    source: str
    """The model card / chat template that defines the format."""


TOOL_FORMATS: dict[str, ToolFormat] = {
    "mistral": ToolFormat(
        name="mistral",
        markers=("[TOOL_CALLS]",),
        call_start="[TOOL_CALLS]",
        example='[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        upstream="vLLM `mistral` (vllm/entrypoints/openai/tool_parsers/mistral_tool_parser.py, MistralToolParser): "
                 "the text before the [TOOL_CALLS] token is content, after it a JSON array of "
                 '{"name", "arguments"} objects; call ids are 9 alphanumeric characters (MistralToolCall), the only '
                 "ids the Mistral templates accept back",
        source="mistralai/Mistral-7B-Instruct-v0.3 tokenizer_config.json chat_template ([AVAILABLE_TOOLS] [...] "
               "[/AVAILABLE_TOOLS] before the last user turn; an assistant's calls as [TOOL_CALLS] [...] with "
               '"id"); Mistral-Nemo-Instruct-2407 writes the same without the spaces',
    ),
    "hermes": ToolFormat(
        name="hermes",
        markers=("<tool_call>",),
        call_start="<tool_call>",
        example='<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        upstream="vLLM `hermes` (vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py, Hermes2ProToolParser): "
                 "each <tool_call>...</tool_call> holds one JSON object {\"name\", \"arguments\"}; a last block left "
                 "unclosed still counts; the text before the first block is content",
        source="Qwen/Qwen2.5-7B-Instruct chat_template (\"For each function call, return a json object with "
               "function name and arguments within <tool_call></tool_call> XML tags\"); NousResearch/"
               "Hermes-3-Llama-3.1-8B tool_use template (the Hermes function-calling format)",
    ),
    "llama3_json": ToolFormat(
        name="llama3_json",
        markers=('"parameters": dictionary of argument name and its value',),
        call_start=None,
        example='{"name": "get_weather", "parameters": {"city": "Paris"}}',
        upstream="vLLM `llama3_json` (vllm/entrypoints/openai/tool_parsers/llama_tool_parser.py, "
                 "Llama3JsonToolParser): the output, after an optional <|python_tag|>, is one or more JSON objects "
                 '{"name", "parameters"} (or "arguments") separated by ";"; output that does not start so is '
                 "content",
        source="meta-llama/Llama-3.1-8B-Instruct chat_template ('Respond in the format {\"name\": function name, "
               '"parameters": dictionary of argument name and its value}. Do not use variables.\'); the model card\'s '
               '"JSON based tool calling"; Llama 3.2 / 3.3 keep it',
    ),
}
"""The tool-call formats known, by name (the vLLM parser name each mirrors). :func:`tool_format` tries them in this
order (Mistral's marker is the most specific)."""

PYTHON_TAG = "<|python_tag|>"
"""Llama 3.1's code-interpreter / tool-call token; vLLM's llama3_json parser skips it before the JSON."""

FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""OpenAI's rule for a function name (``tools[].function.name``): letters, digits, ``_`` and ``-``, 1 to 64."""

_SPACE = " \t\r\n"


def tool_format(chat_template: Optional[str]) -> Optional[str]:
    """The tool-call format (a key of :data:`TOOL_FORMATS`) of a model whose chat template is ``chat_template``.

    ``None`` when there is no template or it has no marker of a known format (SmolLM2's, for one): such a model
    was not trained to call tools, so the frontend answers ``tool_choice`` ``"auto"`` with 400 (see
    :func:`validate_tool_request`). Never raises."""
    if not chat_template:
        return None
    for fmt in TOOL_FORMATS.values():
        if any(m in chat_template for m in fmt.markers):
            return fmt.name
    return None


# ---- calls out of text -----------------------------------------------------------------------------------------


def new_call_id(fmt: Optional[str] = None) -> str:
    """A tool call id: ``call_`` and 24 random letters and digits (OpenAI's shape); for ``mistral``, 9 letters and
    digits, as vLLM's MistralToolCall makes them: the Mistral templates raise on any other id when the
    conversation comes back ("Tool call IDs should be alphanumeric strings with length 9!")."""
    alphabet = string.ascii_letters + string.digits
    if fmt == "mistral":
        return "".join(secrets.choice(alphabet) for _ in range(9))
    return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


def _call(obj: Any, fmt: str) -> Optional[tuple[str, str]]:
    """``(name, arguments as a JSON string)`` of one parsed call object, or ``None`` when it is not a call: not an
    object, no non-empty string ``name``, or arguments (``arguments``, or ``parameters``: Llama's key) that are not
    a JSON object (an object, or a string holding one)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    key = "parameters" if fmt == "llama3_json" and "parameters" in obj else "arguments"
    if key not in obj:
        key = "parameters" if "parameters" in obj else None
    if key is None:
        return None
    args = obj[key]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _prefix_overlap(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a beginning of ``marker`` (0: no part of a marker)."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class _JsonEnd:
    """Finds, character by character, where the JSON object or array that starts a text closes (strings and their
    escapes respected). ``feed`` returns the index just past the closing bracket, once it comes."""

    def __init__(self):
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.pos = 0

    def feed(self, text: str) -> Optional[int]:
        while self.pos < len(text):
            ch = text[self.pos]
            self.pos += 1
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return self.pos
        return None


class ToolCallStream:
    """Reads tool calls out of generated text as it streams, in format ``fmt`` (a key of :data:`TOOL_FORMATS`).

    :meth:`feed` takes each text delta (whole characters, as the frontend's detokenizer gives them) and returns the
    OpenAI ``choices[].delta`` payloads it can say so far: ``{"content": str}`` while no call has started,
    holding back text that may be the start of a call marker (``<tool_call``, ``[TOOL_CAL``, a leading ``{``) or
    whitespace that may border a call; and, as each call completes, ``{"tool_calls": [{"index", "id", "type":
    "function", "function": {"name", "arguments": ""}}]}`` then ``{"tool_calls": [{"index", "function":
    {"arguments": <the arguments JSON>}}]}``. :meth:`finish` says what is left (an unclosed call that parses is a
    call, one that does not is content). What it all adds up to (:func:`merge_deltas`) is what
    :func:`parse_tool_calls` gives for the whole text, however the text was split. Never raises on any text.

    Raises ``ValueError`` only for an unknown ``fmt``."""

    def __init__(self, fmt: str):
        if fmt not in TOOL_FORMATS:
            raise ValueError(f"unknown tool format {fmt!r}: one of {', '.join(TOOL_FORMATS)}")
        self.fmt = fmt
        self.calls = 0
        self._buf = ""
        self._out: list[dict] = []
        self._held = ""          # whitespace of a content segment that has said nothing yet
        self._said = False       # the current content segment has said something
        self._done = False
        # hermes / mistral: inside a call block; llama3_json: "start" | "object" | "between" | "plain"
        self._in_call = False
        self._end: Optional[_JsonEnd] = None
        self._scanned = 0
        self._state = "start"
        self._tag = ""           # llama3_json: the <|python_tag|> before the object being read
        self._ws = ""            # mistral: the spaces between [TOOL_CALLS] and its array

    # -- what comes out --

    def _content(self, text: str) -> None:
        """Text that is content. Whitespace at the start of a segment (after a call, or at the start) is held
        until something else comes (then it goes out with it) or a call comes (then it is dropped)."""
        if not text:
            return
        if self._said:
            self._emit_content(text)
            return
        self._held += text
        if self._held.strip(_SPACE):
            self._emit_content(self._held)
            self._held, self._said = "", True

    def _emit_content(self, text: str) -> None:
        if self._out and "content" in self._out[-1]:
            self._out[-1]["content"] += text
        else:
            self._out.append({"content": text})

    def _tool_call(self, name: str, arguments: str) -> None:
        self._held, self._said = "", False
        index = self.calls
        self.calls += 1
        self._out.append({"tool_calls": [{"index": index, "id": new_call_id(self.fmt), "type": "function",
                                          "function": {"name": name, "arguments": ""}}]})
        self._out.append({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})

    def _take(self) -> list[dict]:
        out, self._out = self._out, []
        return out

    # -- what goes in --

    def feed(self, delta: str) -> list[dict]:
        """The delta payloads ``delta`` lets out (possibly none). Raises ``RuntimeError`` after :meth:`finish`."""
        if self._done:
            raise RuntimeError("ToolCallStream.feed after finish")
        self._buf += delta
        getattr(self, f"_step_{self.fmt}")(final=False)
        return self._take()

    def finish(self) -> list[dict]:
        """The delta payloads left once the text has ended: what was held back, an unclosed call."""
        if not self._done:
            getattr(self, f"_step_{self.fmt}")(final=True)
            if self._held and self.calls == 0:  # whitespace only, and no call: it is the answer
                self._emit_content(self._held)
            self._held, self._done = "", True
        return self._take()

    # -- hermes: <tool_call> JSON </tool_call> --

    def _step_hermes(self, final: bool) -> None:
        start, end = "<tool_call>", "</tool_call>"
        while True:
            if not self._in_call:
                i = self._buf.find(start)
                if i >= 0:
                    self._content(self._buf[:i])
                    self._buf, self._in_call, self._scanned = self._buf[i + len(start):], True, 0
                    continue
                keep = 0 if final else _prefix_overlap(self._buf, start)
                self._content(self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                return
            j = self._buf.find(end, max(0, self._scanned - len(end) + 1))
            if j < 0 and not final:
                self._scanned = len(self._buf)
                return
            inner = self._buf if j < 0 else self._buf[:j]
            block = start + inner + ("" if j < 0 else end)
            self._buf, self._in_call = ("" if j < 0 else self._buf[j + len(end):]), False
            self._call_or_content(inner, block)
            if j < 0:
                return

    def _call_or_content(self, raw: str, block: str) -> None:
        """One call from the JSON text ``raw``; when it is not one, ``block`` (the whole text it came in) is
        content."""
        try:
            call = _call(json.loads(raw), self.fmt)
        except ValueError:
            call = None
        if call:
            self._tool_call(*call)
        else:
            self._content(block)

    # -- mistral: [TOOL_CALLS] [ {...}, ... ] --

    def _step_mistral(self, final: bool) -> None:
        start = "[TOOL_CALLS]"
        while True:
            if not self._in_call:
                i = self._buf.find(start)
                if i >= 0:
                    self._content(self._buf[:i])
                    self._buf, self._in_call, self._end = self._buf[i + len(start):], True, None
                    continue
                keep = 0 if final else _prefix_overlap(self._buf, start)
                self._content(self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                return
            if self._end is None:  # after the marker: spaces, then the array's "["
                body = self._buf.lstrip(_SPACE)
                if not body:
                    if not final:
                        return
                    self._in_call = False
                    self._content(start + self._buf)
                    self._buf = ""
                    return
                if body[0] != "[":  # not a call list: the marker is content, and what follows is read again
                    self._in_call = False
                    self._content(start + self._buf[:len(self._buf) - len(body)])
                    self._buf = body
                    continue
                self._end = _JsonEnd()
                self._ws = self._buf[:len(self._buf) - len(body)]
                self._buf = body
            stop = self._end.feed(self._buf)
            if stop is None and not final:
                return
            raw = self._buf if stop is None else self._buf[:stop]
            self._buf, self._in_call, self._end = ("" if stop is None else self._buf[stop:]), False, None
            block = start + self._ws + raw
            try:
                items = json.loads(raw)
            except ValueError:
                items = None
            calls = [_call(item, self.fmt) for item in items] if isinstance(items, list) and items else [None]
            if all(calls):
                for call in calls:
                    self._tool_call(*call)
            else:
                self._content(block)
            if stop is None:
                return

    # -- llama3_json: [<|python_tag|>] {"name", "parameters"} [; {...}] --

    def _step_llama3_json(self, final: bool) -> None:
        while True:
            if self._state == "plain":
                self._content(self._buf)
                self._buf = ""
                return
            if self._state in ("start", "between"):
                lead = len(self._buf) - len(self._buf.lstrip(_SPACE))
                rest = self._buf[lead:]
                if self._state == "between" and rest.startswith(";"):
                    lead += 1 + len(rest[1:]) - len(rest[1:].lstrip(_SPACE))
                    rest = self._buf[lead:]
                if not rest:
                    if final:
                        self._content(self._buf)
                        self._buf = ""
                    return
                tag = ""
                if self._state == "start" and rest.startswith(PYTHON_TAG):
                    tag = PYTHON_TAG
                elif self._state == "start" and PYTHON_TAG.startswith(rest) and not final:
                    return  # maybe the start of <|python_tag|>
                body = rest[len(tag):]
                if tag and not body.lstrip(_SPACE):
                    if final:
                        self._state = "plain"
                        continue
                    return
                body_lead = len(body) - len(body.lstrip(_SPACE))
                if body[body_lead] != "{":
                    self._state = "plain"
                    continue
                sep = self._buf[:lead]
                if self._state == "start":
                    self._content(sep)  # leading whitespace: held, dropped if a call follows
                    sep = ""
                self._tag = sep + tag + body[:body_lead]
                self._buf = body[body_lead:]
                self._state, self._end = "object", _JsonEnd()
            stop = self._end.feed(self._buf)
            if stop is None and not final:
                return
            raw = self._buf if stop is None else self._buf[:stop]
            self._buf = "" if stop is None else self._buf[stop:]
            try:
                call = _call(json.loads(raw), self.fmt)
            except ValueError:
                call = None
            if call:
                self._tool_call(*call)
                self._state = "between"
            else:
                self._content(self._tag + raw)
                self._state = "plain"
            if stop is None:
                return


def merge_deltas(deltas: Iterable[dict]) -> tuple[Optional[str], list[dict]]:
    """What a stream of delta payloads (:class:`ToolCallStream`'s) adds up to: the content (``None`` when there is
    none) and the complete OpenAI ``tool_calls``, in index order, arguments joined. Raises ``ValueError`` on a
    payload that continues a call never opened."""
    content: list[str] = []
    calls: dict[int, dict] = {}
    for delta in deltas:
        if "content" in delta:
            content.append(delta["content"])
        for part in delta.get("tool_calls", ()):
            if "id" in part:
                calls[part["index"]] = {"id": part["id"], "type": part["type"],
                                        "function": {"name": part["function"]["name"],
                                                     "arguments": part["function"].get("arguments", "")}}
            elif part["index"] in calls:
                calls[part["index"]]["function"]["arguments"] += part["function"].get("arguments", "")
            else:
                raise ValueError(f"tool call delta for index {part['index']} before its id and name")
    return "".join(content) or None, [calls[i] for i in sorted(calls)]


def parse_tool_calls(fmt: str, text: str) -> tuple[Optional[str], list[dict]]:
    """The content left and the OpenAI ``tool_calls`` in ``text``, a whole generation in format ``fmt``.

    Each call is ``{"id": "call_<random>", "type": "function", "function": {"name": str, "arguments": <JSON
    object as a string>}}`` (Mistral ids: 9 letters and digits, see :func:`new_call_id`); arguments are
    re-serialized (``json.dumps``, non-ASCII kept) as vLLM does. Text that does not parse as a call stays content;
    content is ``None`` when nothing but calls (and whitespace around them) was written. The rules per format are
    in :data:`TOOL_FORMATS` and the module docstring. Never raises on any text; ``ValueError`` for an unknown
    ``fmt``."""
    stream = ToolCallStream(fmt)
    return merge_deltas(stream.feed(text) + stream.finish())


def template_messages(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages as the Hugging Face chat templates read them: an assistant's ``tool_calls`` arguments
    (a JSON string in OpenAI's API) as the object they hold (the templates write ``arguments | tojson``); other
    fields as they are. A string that is not a JSON object is left as is. Does not change ``messages``."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            m = dict(m, tool_calls=[_template_call(c) for c in m["tool_calls"]])
        out.append(m)
    return out


def _template_call(call: dict) -> dict:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return dict(call, function=dict(fn, arguments=parsed))
    return call


# ---- tool_choice "required" / a named function: a schema to force the call --------------------------------------


def _named(tool_choice: Any) -> Optional[str]:
    """The function a ``{"type": "function", "function": {"name": ...}}`` tool_choice names, else ``None``."""
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        return name if isinstance(name, str) else None
    return None


def _parameters(tool: dict) -> dict:
    """A tool's parameters schema; an absent one is OpenAI's "no arguments": an empty object."""
    params = tool.get("function", {}).get("parameters")
    return params if params is not None else {"type": "object", "properties": {}}


def forced_call_schema(tools: list[dict], tool_choice: Union[str, dict]) -> dict:
    """The JSON schema a grammar engine enforces so that the model must call a tool.

    ``tool_choice`` ``"required"``: one or more calls of any of ``tools``, as vLLM guides ``required``
    (vllm/entrypoints/openai/protocol.py, ChatCompletionRequest._get_json_schema_from_tool): an array (minItems 1)
    of objects ``{"name": <one tool's name>, "parameters": <that tool's parameters schema>}``, one ``anyOf``
    branch per tool, the tools' ``$defs`` lifted to the top so their ``$ref``s resolve. A named function
    ``{"type": "function", "function": {"name": N}}``: exactly one call of N, the single object ``{"name": N,
    "parameters": ...}`` (vLLM guides with N's parameters alone; the object keeps the name the model writes, and
    :func:`parse_forced` reads both the same way). Names are ``enum``s of one (vLLM's; a ``const``), objects
    close with ``additionalProperties: false`` so the grammar ends them.

    ``tools`` is checked first (:func:`validate_tools`); APIError 400 (param ``tool_choice``) for a
    ``tool_choice`` that is neither, names no tool in ``tools``; (param ``tools``) when two tools define one
    ``$defs`` entry differently."""
    tools = validate_tools(tools)
    validate_tool_choice(tool_choice, tools)
    defs: dict[str, Any] = {}

    def branch(tool: dict) -> dict:
        params = dict(_parameters(tool))
        for key, value in (params.pop("$defs", None) or {}).items():
            if key in defs and defs[key] != value:
                raise APIError(400, f"tools: two tools define $defs {key!r} differently; a forced call needs one "
                                    "definition per name: rename one of them", param="tools")
            defs[key] = value
        return {"type": "object",
                "properties": {"name": {"type": "string", "enum": [tool["function"]["name"]]}, "parameters": params},
                "required": ["name", "parameters"], "additionalProperties": False}

    name = _named(tool_choice)
    if name is not None:
        schema = branch(next(t for t in tools if t["function"]["name"] == name))
    elif tool_choice == "required":
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": [branch(t) for t in tools]}}
    else:
        raise APIError(400, f"tool_choice: {tool_choice!r} does not force a call: a schema is made only for "
                            '"required" or {"type": "function", "function": {"name": ...}}', param="tool_choice")
    if defs:
        schema["$defs"] = defs
    return schema


def parse_forced(text: str, tools: list[dict], tool_choice: Union[str, dict]) -> list[dict]:
    """The OpenAI ``tool_calls`` in ``text``, generated under :func:`forced_call_schema` (``tools``,
    ``tool_choice``): one per array item for ``"required"``, the one object for a named function; arguments are the
    ``parameters`` object as JSON (``json.dumps``, non-ASCII kept), ids ``call_<random>``.

    ``[]`` when ``text`` does not hold that shape (a generation cut by ``max_tokens`` before the JSON closed, a
    name not among ``tools``): answer it as content with its finish_reason. APIError 400 for ``tools`` /
    ``tool_choice`` as :func:`forced_call_schema`."""
    tools = validate_tools(tools)
    validate_tool_choice(tool_choice, tools)
    names = {t["function"]["name"] for t in tools}
    named = _named(tool_choice)
    try:
        value = json.loads(text)
    except ValueError:
        return []
    items = [value] if named is not None else value
    if not isinstance(items, list) or not items:
        return []
    calls = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("parameters"), dict) and item.get("name") in names
                and (named is None or item["name"] == named)):
            return []
        calls.append({"id": new_call_id(), "type": "function",
                      "function": {"name": item["name"], "arguments": json.dumps(item["parameters"],
                                                                                ensure_ascii=False)}})
    return calls


# ---- checking tools and tool_choice ----------------------------------------------------------------------------


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


def _check_parameters(params: Any, where: str) -> None:
    """APIError 400 unless ``params`` is a JSON Schema of an object (OpenAI: "described as a JSON Schema
    object"): a JSON object whose ``type`` (if given) is ``"object"``, ``properties`` (if given) an object of
    schemas, ``required`` (if given) a list of property names."""
    if not isinstance(params, dict):
        raise _bad(where, f"{params!r} is not a JSON Schema object: send an object schema such as "
                          '{"type": "object", "properties": {...}}, or leave parameters out for no arguments')
    kind = params.get("type", "object")
    if kind != "object":
        raise _bad(f"{where}.type", f"{kind!r}: the parameters of a function must be a schema of type \"object\" "
                                    "(its properties are the arguments): wrap the value in an object property")
    props = params.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, (dict, bool)) for v in props.values()):
        raise _bad(f"{where}.properties", f"{props!r} is not an object of property schemas: send "
                                          '{"<argument>": {"type": ...}, ...}')
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _bad(f"{where}.required", f"{required!r} is not a list of property names: send [\"<argument>\", ...]")


def validate_tools(tools: Any) -> list[dict]:
    """``tools`` checked as OpenAI checks them; returned as given.

    APIError 400, ``param`` the failing field (``tools``, ``tools[i].type``, ``tools[i].function``,
    ``tools[i].function.name``, ``tools[i].function.parameters``...): not a non-empty list of objects; a ``type``
    other than ``"function"`` (the only tool type of Chat Completions); no ``function`` object; a function
    without a ``name`` or whose name breaks OpenAI's rule (:data:`FUNCTION_NAME`); the same name twice (a call
    must say which tool it means); a ``description`` that is not a string; ``parameters`` that is not a JSON
    Schema of an object."""
    if not isinstance(tools, list) or not tools:
        raise _bad("tools", f"{tools!r} is not a non-empty list of tools: send [{{\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}], or leave tools out")
    seen: dict[str, int] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _bad(where, f"{tool!r} is not an object: send {{\"type\": \"function\", \"function\": {{...}}}}")
        if tool.get("type") != "function":
            raise _bad(f"{where}.type", f"{tool.get('type')!r}: the only tool type is \"function\": set "
                                        "\"type\": \"function\"")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{where}.function", f"{fn!r} is not an object: send {{\"name\": ..., \"parameters\": ...}}")
        name = fn.get("name")
        if name is None or name == "":
            raise _bad(f"{where}.function.name", "missing: every function needs a name (letters, digits, _ and -, "
                                                 "at most 64): add one")
        if not isinstance(name, str) or not FUNCTION_NAME.match(name):
            raise _bad(f"{where}.function.name", f"{name!r} is not a function name: use letters, digits, _ and - "
                                                 "only, at most 64")
        if name in seen:
            raise _bad(f"{where}.function.name", f"{name!r} is also the name of tools[{seen[name]}]: names must be "
                                                 "unique, so that a call says which tool it means: rename one")
        seen[name] = i
        if "description" in fn and fn["description"] is not None and not isinstance(fn["description"], str):
            raise _bad(f"{where}.function.description", f"{fn['description']!r} is not a string: send the "
                                                        "description as text")
        if fn.get("parameters") is not None:
            _check_parameters(fn["parameters"], f"{where}.function.parameters")
    return tools


def validate_tool_choice(tool_choice: Any, tools: Optional[list[dict]]) -> Union[str, dict]:
    """``tool_choice`` checked against ``tools`` (already checked by :func:`validate_tools`, or ``None``); returned
    as given, ``None`` read as OpenAI's default (``"auto"`` with tools, ``"none"`` without).

    APIError 400, param ``tool_choice`` (or ``tool_choice.function.name``): a value other than ``"none"``,
    ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``; a choice other than
    ``"none"`` with no tools; a named function not in ``tools`` (the message lists those that are)."""
    if tool_choice is None:
        return "auto" if tools else "none"
    if tool_choice in ("none", "auto", "required"):
        if tool_choice != "none" and not tools:
            raise _bad("tool_choice", f"{tool_choice!r} needs tools: send the tools the model may call, or leave "
                                      "tool_choice out")
        return tool_choice
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
            and isinstance(tool_choice.get("function"), dict)):
        raise _bad("tool_choice", f"{tool_choice!r} is not a tool choice: send \"none\", \"auto\", \"required\" or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    name = tool_choice["function"].get("name")
    names = [t["function"]["name"] for t in tools or []]
    if name not in names:
        raise _bad("tool_choice.function.name", f"{name!r} is not one of the tools ({', '.join(names) or 'none'}): "
                                                "name a function listed in tools, or add it there")
    return tool_choice


class ToolPlan(NamedTuple):
    """What a request's tools ask of generation (:func:`validate_tool_request`)."""

    tools: Optional[list[dict]]
    """The tools to show the chat template (``None``: none)."""
    tool_choice: Union[str, dict]
    fmt: Optional[str]
    """The format to read calls in (``tool_choice`` ``"auto"``); ``None`` otherwise."""
    schema: Optional[dict]
    """The schema to guide generation with (``"required"`` / a named function, :func:`forced_call_schema`);
    read the text with :func:`parse_forced`."""


def validate_tool_request(tools: Any, tool_choice: Any, chat_template: Optional[str]) -> ToolPlan:
    """All the checks of a request's ``tools`` and ``tool_choice`` for a model whose chat template is
    ``chat_template``, and what they ask for.

    APIError 400 as :func:`validate_tools` / :func:`validate_tool_choice`, and (param ``tool_choice``) for
    ``"auto"`` on a model whose template has no known tool format (:func:`tool_format` is ``None``): it would
    never call one, and a forced choice (``"required"``, a named function) is the way to use tools with it."""
    if tools is None or tools == []:
        validate_tool_choice(tool_choice, None)
        return ToolPlan(None, "none", None, None)
    tools = validate_tools(tools)
    choice = validate_tool_choice(tool_choice, tools)
    if choice == "none":
        return ToolPlan(tools, choice, None, None)
    if choice == "auto":
        fmt = tool_format(chat_template)
        if fmt is None:
            raise _bad("tool_choice", "\"auto\" (the default when tools are sent): this model's chat template has no "
                                      "tool-call format this server "
                                      f"reads ({', '.join(TOOL_FORMATS)}), so it would not call a tool: send "
                                      "\"required\" or a named function (the call is then forced by a schema), or "
                                      "\"none\"")
        return ToolPlan(tools, choice, fmt, None)
    return ToolPlan(tools, choice, tool_format(chat_template), forced_call_schema(tools, choice))
