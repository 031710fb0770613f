"""pipeline/structured.py and `trtpipe query --json-schema / --regex`: constraint files read and checked before any
request (each error names the file and the fix), and the check of an answer (valid, or one cause). No server."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from pipeline.structured import (CAUSES, Constraint, ConstraintError, Tally, check_answer, check_json,
                                 check_tool_calls, regex_constraint, response_format, schema_file, tools_file)

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}},
         {"type": "function", "function": {"name": "get_time"}}]


@pytest.fixture
def files(tmp_path):
    def write(name, text):
        p = tmp_path / name
        p.write_text(text)
        return p

    return {"person": write("person.json", json.dumps(PERSON)), "tools": write("tools.json", json.dumps(TOOLS)),
            "broken": write("broken.json", '{"type": "object",\n "properties": {'),
            "list": write("list.json", "[1, 2]"), "badschema": write("badschema.json", '{"type": "objekt"}'),
            "badtools": write("badtools.json", '[{"type": "function", "function": {"name": "no spaces"}}]'),
            "missing": tmp_path / "missing.json", "folder": tmp_path}


def test_a_schema_file_becomes_the_guided_inputs_and_the_openai_field(files):
    c = schema_file(files["person"])
    assert c.triton_inputs() == {"guided_decoding_guide_type": "json_schema",
                                 "guided_decoding_guide": json.dumps(PERSON)}
    assert c.openai_fields() == {"response_format": {"type": "json_schema",
                                                     "json_schema": {"name": "person", "schema": PERSON}}}
    j = response_format("json_object")
    assert j.triton_inputs() == {"guided_decoding_guide_type": "json"}  # no guide text for json
    assert j.openai_fields() == {"response_format": {"type": "json_object"}}
    assert response_format(f"json_schema:{files['person']}").schema == PERSON
    assert regex_constraint("(yes|no)").triton_inputs() == {"guided_decoding_guide_type": "regex",
                                                            "guided_decoding_guide": "(yes|no)"}


@pytest.mark.parametrize("key, words", [
    ("missing", ["missing.json", "no such file", "give the path"]),
    ("folder", ["is a folder", "give the path"]),
    ("broken", ["broken.json", "not valid JSON", "line 2", "fix the file"]),
    ("list", ["list.json", "JSON list", "write the schema as an object"]),
    ("badschema", ["badschema.json", "not a valid JSON Schema at type", "objekt", "fix the schema"]),
])
def test_each_bad_schema_file_is_named_with_the_fix(files, key, words):
    with pytest.raises(ConstraintError) as exc:
        schema_file(files[key])
    for w in words:
        assert w in str(exc.value), str(exc.value)


def test_bad_response_formats_regexes_and_tools_are_refused_by_name(files):
    with pytest.raises(ConstraintError, match="give json_object, or json_schema:FILE"):
        response_format("xml")
    with pytest.raises(ConstraintError, match="give json_object"):
        response_format("json_schema:")
    with pytest.raises(ConstraintError, match=r"--regex '\(': the server would refuse it: invalid regex"):
        regex_constraint("(")
    with pytest.raises(ConstraintError, match=r"badtools.json: .*no spaces.* is not a function name"):
        tools_file(files["badtools"])
    with pytest.raises(ConstraintError, match=r"--tool-choice 'nope': .*get_weather, get_time"):
        tools_file(files["tools"], "nope")
    c = tools_file(files["tools"], "get_time")
    assert c.openai_fields() == {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    assert tools_file(files["tools"], "required").openai_fields()["tool_choice"] == "required"
    with pytest.raises(ConstraintError, match="OpenAI frontend"):
        c.triton_inputs()


@pytest.mark.parametrize("text, schema, obj, cut, cause", [
    ('{"name": "Ann", "age": 30}', PERSON, False, False, None),
    ('  {"name": "Ann", "age": 30}\n', PERSON, False, False, None),
    ('{"name": "Ann", "age": 300}', PERSON, False, False, "schema_mismatch"),
    ('{"name": "Ann", "age": 30, "x": 1}', PERSON, False, False, "schema_mismatch"),
    ('{"name": "An', PERSON, False, True, "cut_by_max_tokens"),
    ('{"a": {"b": 1}, "c": "unfinish', None, True, True, "cut_by_max_tokens"),  # a complete inner object is no value
    ('{"name": "An', PERSON, False, False, "not_json"),
    ('Sure! ```json\n{"a": 1}\n```', None, True, False, "extra_text"),
    ('Sure! ```json\n{"a": 1}\n```', None, True, True, "extra_text"),
    ("[1, 2]", None, True, False, "not_an_object"),
    ("Paris is the capital.", None, True, False, "not_json"),
])
def test_an_answer_is_valid_or_has_one_cause(text, schema, obj, cut, cause):
    v = check_json(text, schema, object_only=obj, cut=cut)
    assert (v.valid, v.cause) == (cause is None, cause), v
    assert cause is None or cause in CAUSES


def test_tool_calls_are_checked_against_the_tools(files):
    req, named = tools_file(files["tools"], "required"), tools_file(files["tools"], "get_weather")

    def call(name, args):
        return {"id": "call_x", "type": "function", "function": {"name": name, "arguments": args}}

    good = call("get_weather", '{"city": "Paris", "unit": "celsius"}')
    assert check_tool_calls([good], req).valid and check_tool_calls([good, call("get_time", "{}")], req).valid
    for calls, c, cause in (([], req, "no_tool_call"), ([call("get_time", "{}")], named, "wrong_function"),
                            ([call("nope", "{}")], req, "unknown_function"),
                            ([call("get_weather", '{"city": "Paris"}')], req, "bad_arguments"),
                            ([call("get_weather", '{"city": "Paris", "unit": "kelvin"}')], req, "bad_arguments"),
                            ([call("get_weather", "[1]")], req, "bad_arguments"),
                            ([call("get_weather", '{"city": ')], req, "bad_arguments")):
        assert check_tool_calls(calls, c).cause == cause, calls
    assert check_answer(req, "[{...", tool_calls=None, cut=True).cause == "cut_by_max_tokens"


def test_regex_answers_and_the_tally():
    c = regex_constraint("(yes|no)")
    t = Tally()
    for text, cut in (("yes", False), ("no", False), ("maybe", False), ("ye", True)):
        t.add(check_answer(c, text, cut=cut))
    d = t.as_dict()
    assert (d["checked"], d["valid"], d["valid_fraction"]) == (4, 2, 0.5)
    assert d["failures_by_cause"] == {"no_match": 1, "cut_by_max_tokens": 1}
    assert d["first_failure_by_cause"]["no_match"] == "maybe"
    assert Constraint("json_object", "json").describe()["validated_with"] == "jsonschema"


def test_query_refuses_a_bad_schema_before_anything_else(files, tmp_path, capsys):
    """The file is checked before the build is resolved or a server asked: a build file that does not exist is
    never reached."""
    nowhere = str(tmp_path / "no-such-build.yaml")
    for key, words in (("broken", ["broken.json", "line 2"]), ("missing", ["missing.json", "no such file"]),
                       ("badschema", ["badschema.json", "objekt"])):
        assert main(["query", "--build", nowhere, "--json-schema", str(files[key]), "hi"]) == 2
        err = capsys.readouterr().err
        assert all(w in err for w in words) and "no-such-build" not in err, err
    assert main(["query", "--build", nowhere, "--regex", "(", "hi"]) == 2
    assert "--regex '('" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one constraint per query
        main(["query", "--regex", "x", "--json-schema", str(files["person"]), "hi"])
