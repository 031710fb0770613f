"""`trtpipe loadtest run --response-format / --tools / --tool-choice / --check-only`: arguments refused before any
server (each naming the file or flag and the fix), the request payloads, the answer checks and their counts in
the report; one short end-to-end run against the real server serving the default build (marked e2e)."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.cli import main
from pipeline.loadtest.api import check_answers
from pipeline.loadtest.config import LoadTestConfig, constraint_problems
from pipeline.loadtest.metrics import RequestRecord, summarize
from pipeline.loadtest.openai_client import merge_tool_calls, openai_body
from pipeline.loadtest.report import compare, format_summary, write_reports
from pipeline.loadtest.runner import build_request
from pipeline.loadtest.workload import RequestSpec
from pipeline.serve import free_ports
from pipeline.structured import response_format, tools_file

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}]


@pytest.fixture
def person(tmp_path):
    p = tmp_path / "person.json"
    p.write_text(json.dumps(PERSON))
    return p


@pytest.fixture
def tools(tmp_path):
    p = tmp_path / "tools.json"
    p.write_text(json.dumps(TOOLS))
    return p


def test_structured_arguments_are_checked_all_at_once(person, tools, tmp_path):
    assert constraint_problems("triton", f"json_schema:{person}", None, None) == []
    assert constraint_problems("openai-chat", None, tools, "required") == []
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    p = constraint_problems("triton", f"json_schema:{broken}", tools, "nope", "ignore_eos")
    text = "\n".join(p)
    for words in ("broken.json: not valid JSON", "tool calling is a chat feature", "one constraint per run",
                  "output lengths cannot be fixed", "--tool-choice 'nope'"):
        assert words in text, text
    assert "needs tools" in "\n".join(constraint_problems("openai-chat", None, None, "required"))
    assert "check_only needs response_format" in "\n".join(constraint_problems("triton", None, None, None,
                                                                               check_only=True))
    # a --check-only baseline may fix output lengths: nothing is sent that a fixed length would break
    assert constraint_problems("triton", "json_object", None, None, "ignore_eos", check_only=True) == []
    assert LoadTestConfig(response_format="xml").problems() == [
        "--response-format 'xml': give json_object, or json_schema:FILE with FILE a JSON Schema file"]


def test_the_cli_refuses_bad_constraints_before_starting_or_reaching_a_server(person, tmp_path, capsys):
    url = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens: a refusal here comes before any request
    missing = tmp_path / "nope.json"
    for args, words in ((["--response-format", f"json_schema:{missing}"], "nope.json: no such file"),
                        (["--response-format", "json_object", "--ignore-eos"], "output lengths cannot be fixed"),
                        (["--tools", str(person)], "tool calling is a chat feature"),
                        (["--tool-choice", "auto"], "needs tools")):
        assert main(["loadtest", "run", "--url", url, *args]) == 2
        err = capsys.readouterr().err
        assert words in err and "cannot reach" not in err, err
    # no --url either: the build's server would be started, but the arguments are refused first
    assert main(["loadtest", "run", "--model-repo", str(tmp_path), "--response-format", "yaml"]) == 2
    assert "give json_object" in capsys.readouterr().err


def test_payloads_carry_the_constraint(person, tools):
    spec = RequestSpec("Describe a person.", 5, 32)
    c = response_format(f"json_schema:{person}")
    inputs = {"collect_text": True, **c.triton_inputs()}
    req = build_request("ensemble", "7", spec, inputs)
    assert {i.name for i in req.inputs} >= {"guided_decoding_guide_type", "guided_decoding_guide"}
    guide = next(i for i in req.inputs if i.name == "guided_decoding_guide")
    assert guide.datatype == "BYTES" and json.loads(req.raw_input_contents[
        [i.name for i in req.inputs].index("guided_decoding_guide")][4:]) == PERSON
    assert "text_output" in {o.name for o in req.outputs}
    plain = build_request("ensemble", "8", spec, {})
    assert {o.name for o in plain.outputs} == {"num_output_tokens"}  # no text asked for without a constraint
    _, body = openai_body("openai-chat", "m", "1", spec, {"openai_fields": tools_file(tools, "get_weather")
                                                           .openai_fields()})
    assert body["tools"] == TOOLS and body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    _, body = openai_body("openai-completions", "m", "1", spec, {"openai_fields": c.openai_fields()})
    assert body["response_format"]["json_schema"]["schema"] == PERSON and body["prompt"] == spec.text


def test_tool_call_deltas_merge_into_calls():
    deltas = [{"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
              {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                               "function": {"name": "get_time", "arguments": "{}"}}]}]
    calls = merge_tool_calls(deltas)
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("call_a", "get_weather", '{"city": "Paris"}'), ("call_b", "get_time", "{}")]


def _rec(i, text, tokens, asked=32, finish=None, warmup=False, error=None):
    r = RequestRecord(i, 0.0, sent=0.0, requested_tokens=asked, warmup=warmup)
    r.response_times, r.response_tokens = [0.1 * (k + 1) for k in range(tokens)], [1] * tokens
    r.text, r.finish_reason = text, finish
    if error:
        r.error, r.error_kind = error, "server_error"
    else:
        r.done = r.response_times[-1] if tokens else 0.1
    return r


def test_answers_are_counted_by_cause_and_shown_in_the_report(person, tmp_path):
    c = response_format(f"json_schema:{person}")
    recs = [_rec(0, '{"name": "Ann", "age": 30}', 12), _rec(1, '{"name": "Bo", "age": 4}', 10),
            _rec(2, '{"name": "Cyri', 32),                             # ran into max_tokens (Triton: tokens)
            _rec(3, '{"name": "Di", "age": 900}', 12),                 # out of the schema
            _rec(4, '{"name": "Ed', 20, finish="length"),              # OpenAI says length
            _rec(5, "garbage", 3, warmup=True),                        # warm-up: not counted
            _rec(6, None, 0, error="boom")]                            # failed: not counted
    st = check_answers(recs, c)
    assert (st["checked"], st["valid"]) == (5, 2) and st["sent"] is True
    assert st["failures_by_cause"] == {"cut_by_max_tokens": 2, "schema_mismatch": 1}
    assert recs[3].check["cause"] == "schema_mismatch" and recs[5].check is None and recs[6].check is None
    s = summarize(recs)
    s["structured"] = st
    report = {"points": [{"point": {"mode": "closed", "concurrency": 1}, "summary": s,
                          "validity": {"valid": True, "reasons": []}}], "tokenizer": None,
              "tool": "trtpipe loadtest", "verdict": {"invalid_points": []}}
    text = format_summary(report)
    assert "answers ok" in text and "2/5" in text
    assert "cut_by_max_tokens: 2, schema_mismatch: 1" in text
    write_reports(report, tmp_path, plots=False)
    row = (tmp_path / "summary.csv").read_text().splitlines()
    assert row[0].endswith("answers_checked,answers_valid,answers_valid_fraction") and row[1].endswith("5,2,0.4")
    assert "answers valid" in compare(report, report)


def test_an_answer_sent_whole_at_the_end_has_no_tpot():
    """A forced tool call comes through the OpenAI frontend as one event: its time per token is not observable
    (it is not 0)."""
    r = RequestRecord(0, 0.0, sent=0.0, requested_tokens=40)
    r.response_times, r.response_tokens, r.done = [2.0, 2.001], [40, 0], 2.001
    assert math.isnan(r.tpot) and r.ttft == pytest.approx(2.0)


# ---- end to end: the default build on the real server --------------------------------------------------------


@pytest.mark.e2e
def test_constrained_load_counts_valid_answers(default_server, frontend, built_default, person, tools, tmp_path,
                                               capsys):
    """Triton with a JSON schema and its --check-only baseline; the OpenAI chat endpoint with a named tool.
    Every constrained Triton answer validates (the grammar makes it; max_tokens leaves room); the baseline carries
    no guide (the same prompts and max_tokens), so no answer is a person; every request is checked once."""
    common = ["--num-requests", "3", "--warmup", "1", "--input-len", "16", "--concurrency", "2", "--no-plots",
              "--tokenizer", str(built_default / "engine")]
    grpc = default_server.cfg.grpc_url
    runs = {"schema": ["--url", grpc, "--response-format", f"json_schema:{person}", "--output-len", "64"],
            "baseline": ["--url", grpc, "--response-format", f"json_schema:{person}", "--check-only",
                         "--output-len", "64"],
            "tool": ["--url", frontend.launch.url + "/v1", "--endpoint", "openai-chat", "--tools", str(tools),
                     "--tool-choice", "get_weather", "--output-len", "96"]}
    reps = {}
    for name, args in runs.items():
        assert main(["loadtest", "run", *args, *common, "-o", str(tmp_path / name)]) == 0, capsys.readouterr().err
        reps[name] = json.loads((tmp_path / name / "report.json").read_text())
        st = reps[name]["points"][0]["summary"]["structured"]
        reqs = [r for r in reps[name]["points"][0]["requests"] if not r["warmup"]]
        assert st["checked"] == 3 and len(reqs) == 3 and all(r["check"] is not None for r in reqs), st
        assert st["valid"] + sum(st["failures_by_cause"].values()) == 3
        assert reps[name]["constraint"]["kind"] == ("tools" if name == "tool" else "json_schema")
    s = reps["schema"]["points"][0]
    assert s["summary"]["structured"]["valid"] == 3, [r["text"] for r in s["requests"]]
    assert all(json.loads(r["text"])["age"] <= 120 for r in s["requests"] if not r["warmup"])
    assert reps["schema"]["request_inputs"]["guided_decoding_guide_type"] == "json_schema"
    b = reps["baseline"]
    assert "guided_decoding_guide_type" not in b["request_inputs"]
    assert not b["points"][0]["summary"]["structured"]["sent"]
    assert b["points"][0]["summary"]["structured"]["valid"] == 0  # unguided, random-word prompts: no person JSON
    t = reps["tool"]["points"][0]
    calls = [r for r in t["requests"] if not r["warmup"] and r["tool_calls"]]
    assert t["summary"]["structured"]["answers_with_a_call"] == len(calls)
    for r in calls:  # a parsed call of the named function; valid unless its arguments broke the schema
        assert r["tool_calls"][0]["function"]["name"] == "get_weather"
        assert r["check"]["valid"] == (r["check"]["cause"] is None)
    assert t["summary"]["structured"]["valid"] >= 1, [r["text"] for r in t["requests"]]
    out = capsys.readouterr().out
    assert "answers ok" in out and "3/3" in out
