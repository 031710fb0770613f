"""Workloads, config rules and tensor checks (no server)."""

import json

import pytest

from pipeline.loadtest.api import check_tensors
from pipeline.loadtest.config import LoadTestConfig
from pipeline.loadtest.workload import WordTokenizer, from_jsonl, parse_length, synthetic


def test_synthetic_is_seeded_unique_and_sized():
    a = synthetic(20, "uniform:5:9", "normal:16:4", WordTokenizer(), seed=3)
    b = synthetic(20, "uniform:5:9", "normal:16:4", WordTokenizer(), seed=3)
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert len({r.prompt for r in a.requests}) == 20
    assert all(5 <= r.input_tokens <= 9 and r.max_tokens >= 1 for r in a.requests)


def test_jsonl_dataset(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "hello there"}) + "\n" + json.dumps({"text": "hi", "output_len": 3}) + "\n")
    wl = from_jsonl(p, 5, "7", WordTokenizer(), seed=0)
    assert len(wl.requests) == 5 and {r.max_tokens for r in wl.requests} <= {3, 7}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"nope": 1}\n')
    with pytest.raises(Exception, match="no prompt field"):
        from_jsonl(bad, 1, "7", WordTokenizer())


def test_length_forms():
    assert parse_length("12") == ("fixed", (12,))
    with pytest.raises(ValueError, match="uniform:LO:HI"):
        parse_length("uniform:9:3")


def test_config_reports_every_problem_at_once():
    cfg = LoadTestConfig(mode="open", rate=[-2.0], num_requests=0, burstiness=0, output_len="x",
                         slo_attainment=2.0)
    text = "\n".join(cfg.problems())
    for word in ("rate", "num_requests", "burstiness", "output_len", "slo_attainment"):
        assert word in text
    assert LoadTestConfig().problems() == []


def test_tensor_names_checked():
    cfg = LoadTestConfig(fixed_output="min_tokens")
    problems = check_tensors(["prompt", "max_tokens"], ["text_output"], cfg)
    text = "\n".join(problems)
    assert "no input 'text_input'" in text and "num_output_tokens" in text and "min_tokens" in text


def test_shared_prefix_workload_gives_each_group_one_prefix():
    from pipeline.loadtest.workload import WordTokenizer, synthetic

    wl = synthetic(7, "5", "3", WordTokenizer(), seed=1, shared_prefixes=3, shared_prefix_len=20)
    prefixes = [r.shared_prefix for r in wl.requests]
    assert prefixes[0] == prefixes[3] == prefixes[6] and len(set(prefixes)) == 3
    assert all(r.text.startswith(r.shared_prefix) and r.input_tokens == 20 + 5 for r in wl.requests)
    assert len({r.prompt for r in wl.requests}) == 7  # the rest of each prompt stays unique
    assert wl.description["shared_prefixes"] == 3
    again = synthetic(7, "5", "3", WordTokenizer(), seed=99, shared_prefixes=3, shared_prefix_len=20)
    assert [r.shared_prefix for r in again.requests] == prefixes  # every point and run shares them
    assert all(r.shared_prefix == "" for r in synthetic(3, "5", "3", WordTokenizer()).requests)


def test_openai_endpoint_rules():
    from pipeline.loadtest.config import LoadTestConfig

    probs = LoadTestConfig(endpoint="openai-chat", url="127.0.0.1:8001", fixed_output="min_tokens").problems()
    assert any("base URL" in p for p in probs) and any("ignore-eos" in p for p in probs)
    assert LoadTestConfig(endpoint="openai-chat", url="http://127.0.0.1:9000/v1").problems() == []
    assert any("endpoint" in p for p in LoadTestConfig(endpoint="grpc").problems())


def test_a_point_where_every_request_failed_is_invalid():
    """All requests refused (e.g. prompts over max_input_len): not a measurement, whatever the SLOs say."""
    from pipeline.loadtest.api import validity

    cfg = LoadTestConfig()
    summary = {"requests": {"sent": 4, "completed": 0, "errors_by_kind": {"invalid_request": 4}}}
    v = validity(cfg, {"mode": "closed", "concurrency": 2}, summary, [{"cpu_util": 0.1}])
    assert not v["valid"] and "every request failed (invalid_request: 4)" in v["reasons"][0]
    ok = {"requests": {"sent": 4, "completed": 3, "errors_by_kind": {"invalid_request": 1}}}
    assert validity(cfg, {"mode": "closed", "concurrency": 2}, ok, [{"cpu_util": 0.1}])["valid"]
