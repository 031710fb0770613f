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
