"""Structured output and tool calls from the real tritonserver serving the default build, through the OpenAI
frontend and the official ``openai`` client, and through the Triton ensemble's guided-decoding inputs: every
answer under a JSON schema validates (``jsonschema``), streamed and not; regex, choice and grammar guides; a
forced tool call always parses; tool round trips rendered with three model families' real chat templates; bad
guides are 400s naming the field, with the server serving afterwards."""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m"
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 24},
    "languages": {"type": "array", "items": {"enum": ["English", "中文", "Français", "Español"]}, "maxItems": 3}},
    "required": ["name", "age", "city", "languages"], "additionalProperties": False}
PROMPTS = ["Describe a person who lives in Paris.", "请描述一位住在北京的人。", "Décris une personne qui vit à Lyon 🇫🇷.",
           "Describe a software engineer.", "Invent a character for a novel set in Tokyo.", "Who is your best friend?"]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 24}}, "required": ["city"]}}}]
TEMPLATES = {"llama3_json": "llama-3.1-8b-instruct.jinja", "hermes": "qwen2.5-7b-instruct.jinja",
             "mistral": "mistral-7b-instruct-v0.3.jinja"}


def _frontend(default_server, tokenizer_dir, log_dir):
    from builders.spec import load_spec
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, free_ports
    from tests.conftest import DEFAULT_BUILD

    launch = frontend_launch(load_spec(DEFAULT_BUILD, "cpu"), default_server.cfg, free_ports(1)[0], tokenizer_dir)
    launch.log_file = log_dir / "openai_frontend.log"
    return OpenAIFrontend(launch).start()


@pytest.fixture(scope="module")
def client(frontend):
    import openai

    return openai.OpenAI(base_url=frontend.launch.url + "/v1", api_key="unused", max_retries=0)


def _person_format():
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_every_answer_under_a_json_schema_validates(client, stream):
    for i, prompt in enumerate(PROMPTS[:3] if stream else PROMPTS[3:]):
        args = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=120, temperature=0.8,
                    seed=i, response_format=_person_format())
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args)
                           if c.choices)
        else:
            answer = client.chat.completions.create(**args)
            assert answer.choices[0].finish_reason == "stop"
            text = answer.choices[0].message.content
        jsonschema.validate(json.loads(text), PERSON)


def test_json_object_regex_choice_and_grammar(client):
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "请用JSON介绍北京。"}],
                                            max_tokens=100, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    date = client.completions.create(model=MODEL, prompt="The date today is", max_tokens=12,
                                     extra_body={"guided_regex": r" 20[0-9]{2}-[01][0-9]-[0-3][0-9]"})
    assert __import__("re").fullmatch(r" 20[0-9]{2}-[01][0-9]-[0-3][0-9]", date.choices[0].text)
    # sampled (no temperature): a choice may come as any split into tokens, one byte each at worst, so the budget
    # is the longest choice's bytes (10); 4 tokens cut "peut-être" once the server's sampler took a longer split
    pick = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is Paris in France?"}],
                                          max_tokens=12, extra_body={"guided_choice": ["oui", "non", "peut-être"]})
    assert pick.choices[0].message.content in ("oui", "non", "peut-être")
    tea = client.completions.create(model=MODEL, prompt="Order:", max_tokens=24,
                                    extra_body={"guided_grammar": 'root ::= " un " ("café ☕" | "thé 🍵")'})
    assert tea.choices[0].text in (" un café ☕", " un thé 🍵")


def test_the_openai_clients_parse_helper_gets_a_pydantic_model(client):
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    parsed = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "The capital of Japan?"}],
                                           max_tokens=60, temperature=0, response_format=City)
    assert isinstance(parsed.choices[0].message.parsed, City)


def test_the_ensemble_takes_the_guided_decoding_inputs(default_server):
    """Upstream's Triton inputs (guided_decoding_guide_type / _guide) on the ensemble, as a Triton client sends
    them; a bad schema fails that request only."""
    from pipeline.client import RequestFailed, stream_generate

    def ask(guide_type, guide):
        extra = {"guided_decoding_guide_type": guide_type, "guided_decoding_guide": guide}
        try:
            return "".join(c.text for c in stream_generate(f"127.0.0.1:{default_server.cfg.grpc_port}",
                                                           "Describe a person. JSON:", 120, extra=extra))
        except RequestFailed as err:
            return err

    jsonschema.validate(json.loads(ask("json_schema", json.dumps(PERSON))), PERSON)
    error = ask("json_schema", '{"type": "object", "properties": ')
    assert not isinstance(error, str) and "not valid JSON" in str(error)
    error = ask("structural_tag", "{}")
    assert "guided_decoding_guide_type" in str(error) and "json_schema" in str(error)
    jsonschema.validate(json.loads(ask("json_schema", json.dumps(PERSON))), PERSON)  # still serving


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_choice_required_and_named_always_give_a_call_that_parses(client, stream):
    choices = ["required", {"type": "function", "function": {"name": "get_time"}}]
    for i, (prompt, choice) in enumerate([(p, c) for p in PROMPTS[:2] for c in choices]):
        args = dict(model=MODEL, messages=[{"role": "user", "content": f"Weather or time? {prompt}"}], max_tokens=120,
                    temperature=0.7, seed=i, tools=WEATHER, tool_choice=choice)
        if stream:
            calls, reason = {}, None
            for chunk in client.chat.completions.create(stream=True, **args):
                for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                    call["name"] += d.function.name or ""
                    call["arguments"] += d.function.arguments or ""
                reason = (chunk.choices[0].finish_reason if chunk.choices else None) or reason
            calls = list(calls.values())
        else:
            answer = client.chat.completions.create(**args)
            reason = answer.choices[0].finish_reason
            calls = [{"name": c.function.name, "arguments": c.function.arguments}
                     for c in answer.choices[0].message.tool_calls]
        assert reason == "tool_calls" and calls
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in WEATHER}
        for call in calls:
            assert choice == "required" or call["name"] == "get_time"
            jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


@pytest.mark.parametrize("fmt", sorted(TEMPLATES))
def test_a_tool_round_trip_with_each_familys_chat_template(default_server, built_default, tmp_path, fmt):
    """call -> tool message -> answer, the prompts rendered with the family's real chat template (recorded in
    tests/assets/chat_templates) over the default model's tokenizer and weights: the frontend reads that format
    (tool_choice "auto" is accepted), renders the tools and the tool result, and the forced call parses."""
    import openai

    from tests.conftest import REPO

    tok = tmp_path / "tokenizer"
    shutil.copytree(built_default / "engine", tok, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    (tok / "chat_template.jinja").write_text((REPO / "tests/assets/chat_templates" / TEMPLATES[fmt]).read_text())
    cfg = json.loads((tok / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    fe = _frontend(default_server, tok, tmp_path)
    try:
        client = openai.OpenAI(base_url=fe.launch.url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "What is the weather in Zürich?"}]
        first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=80, temperature=0,
                                               tools=WEATHER[:1], tool_choice="required")
        call = first.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"]
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "name": "get_weather",
                      "content": json.dumps({"temperature": 21, "unit": "celsius", "sky": "☀️"})}]
        second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                                tools=WEATHER[:1], tool_choice="auto")
        message, reason = second.choices[0].message, second.choices[0].finish_reason
        assert (reason == "tool_calls" and message.tool_calls) or (reason in ("stop", "length") and
                                                                  isinstance(message.content, str))
    finally:
        fe.stop(10)


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objet"}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_regex": "a(b"}, "guided_regex"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar"),
    ({"guided_regex": "a" * 300_000}, "guided_regex"),
    ({"guided_regex": "a+", "response_format": {"type": "json_object"}}, "guided_regex"),
    ({"tools": WEATHER, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": WEATHER, "tool_choice": "auto"}, "tool_choice"),  # SmolLM2's template has no tool format
    ({"tools": WEATHER, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_guides_are_400s_naming_the_field_and_the_server_keeps_serving(client, extra, param):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                       extra_body=extra)
    assert err.value.body["param"] == param and err.value.body["message"].startswith(param.split(".")[0])
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Capital of France?"}],
                                            max_tokens=40, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
