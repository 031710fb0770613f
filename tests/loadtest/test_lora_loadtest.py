"""The load tester over several models (``--models``: the base and LoRA adapters): requests spread round-robin,
each carrying its model (Triton: the ``lora_task_id`` tensor; OpenAI: ``model``), the task ids read from the
build's plan.json, and each model's figures in report.json, summary.csv and the printed table beside the totals.
Against a real server: tests/test_lora_serving.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.loadtest.api import assign_models
from pipeline.loadtest.config import LoadTestConfig
from pipeline.loadtest.metrics import SLO, RequestRecord, by_model, summarize
from pipeline.loadtest.report import format_summary, write_reports
from pipeline.loadtest.workload import RequestSpec

BASE = "smollm2-135m"


def test_requests_go_round_robin_over_the_models():
    reqs = [RequestSpec(f"p{i}", 3, 4) for i in range(7)]
    out = assign_models(reqs, ["sql", "poet", BASE])
    assert [r.model for r in out] == ["sql", "poet", BASE, "sql", "poet", BASE, "sql"]
    assert [r.prompt for r in out] == [r.prompt for r in reqs]


def test_the_triton_request_carries_the_adapters_task_id_as_uint64_and_the_base_none():
    from pipeline.loadtest.runner import build_request

    inputs = {"lora_task_ids": {"sql": 1, BASE: 0}, "end_id": 5}
    for model, want in (("sql", [1]), (BASE, None), ("", None)):
        req = build_request("ensemble", "1", RequestSpec("hi", 1, 4, model=model), inputs)
        got = {i.name: i for i in req.inputs}
        assert "lora_task_ids" not in got
        if want is None:
            assert "lora_task_id" not in got
            continue
        t = got["lora_task_id"]
        assert t.datatype == "UINT64" and list(t.shape) == [1, 1]
        k = [i.name for i in req.inputs].index("lora_task_id")
        assert np.frombuffer(req.raw_input_contents[k], dtype="<u8").tolist() == want


def test_the_openai_request_names_its_model():
    from pipeline.loadtest.openai_client import openai_body

    _, body = openai_body("openai-chat", BASE, "1", RequestSpec("hi", 1, 4, model="poet"), {})
    assert body["model"] == "poet"
    _, body = openai_body("openai-completions", BASE, "1", RequestSpec("hi", 1, 4), {})
    assert body["model"] == BASE


def test_a_model_the_build_does_not_serve_is_named_before_anything_is_sent():
    cfg = LoadTestConfig(models=["sql", "nope", "sql"], lora_task_ids={BASE: 0, "sql": 1})
    problems = "\n".join(cfg.problems())
    assert "'nope' neither the build's base model nor one of its LoRA adapters (served: 'smollm2-135m', 'sql')" \
        in problems and "a model named twice" in problems
    assert not LoadTestConfig(models=["sql", BASE], lora_task_ids={BASE: 0, "sql": 1}).problems()
    # the OpenAI endpoints ask the server instead (check_openai: GET /v1/models)
    assert not LoadTestConfig(endpoint="openai-chat", url="http://h:1/v1", models=["x"]).problems()


def test_the_task_ids_come_from_the_builds_plan_json(tmp_path):
    import argparse

    from pipeline.loadtest.cli import lora_task_ids, models_arg
    from tests.conftest import DEFAULT_BUILD

    spec = tmp_path / "lora.yaml"
    spec.write_text(Path(DEFAULT_BUILD).read_text() + "\nlora:\n  adapters:\n    sql: a/sql\n    poet: a/poet\n")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "plan.json").write_text(json.dumps({"lora": {"adapters": [
        {"name": "poet", "task_id": 2, "path": "/a/poet"}, {"name": "sql", "task_id": 1, "path": "/a/sql"}]}}))
    args = argparse.Namespace(build=str(spec), target="cpu", quant=None, runtime=None, out=None)
    assert lora_task_ids(args, folder) == {BASE: 0, "sql": 1, "poet": 2}
    assert models_arg(" sql, poet ,,smollm2-135m") == ["sql", "poet", BASE] and models_arg(None) == []


def _rec(i, model, sent, times):
    r = RequestRecord(i, sent, sent=sent, requested_tokens=len(times), model=model)
    r.response_times, r.response_tokens, r.done = list(times), [1] * len(times), times[-1]
    return r


def test_each_models_figures_are_its_own_requests_beside_the_totals(tmp_path):
    recs = [_rec(0, "sql", 0.0, [0.1, 0.2, 0.3]), _rec(1, BASE, 0.0, [0.5, 0.9]),
            _rec(2, "sql", 1.0, [1.1, 1.2, 1.3]), _rec(3, BASE, 1.0, [1.5, 1.9])]
    per = by_model(recs)
    assert list(per) == ["sql", BASE]
    assert per["sql"]["ttft_s"]["mean"] == pytest.approx(0.1) and per[BASE]["ttft_s"]["mean"] == pytest.approx(0.5)
    assert per["sql"]["tpot_s"]["mean"] == pytest.approx(0.1) and per[BASE]["itl_s_pooled"]["mean"] == \
        pytest.approx(0.4)
    assert per["sql"]["output_token_throughput"] == pytest.approx(6 / 1.3)
    assert per[BASE]["requests"]["completed"] == 2
    assert by_model([_rec(0, None, 0.0, [0.1])]) == {}
    total = summarize(recs, SLO())
    point = {"point": {"mode": "closed", "concurrency": 2}, "summary": {**total, "by_model": per},
             "validity": {"valid": True, "reasons": []}, "requests": []}
    report = {"tool": "trtpipe loadtest", "points": [point], "verdict": {"invalid_points": []}}
    write_reports(report, tmp_path, plots=False)
    rows = list(csv.DictReader(open(tmp_path / "summary.csv")))
    assert [r["model"] for r in rows] == ["all", "sql", BASE]
    assert [r["completed"] for r in rows] == ["4", "2", "2"]
    assert float(rows[1]["ttft_s_p50"]) == pytest.approx(0.1) and float(rows[2]["ttft_s_p50"]) == pytest.approx(0.5)
    assert json.loads((tmp_path / "report.json").read_text())["points"][0]["summary"]["by_model"]["sql"]
    text = format_summary(report).splitlines()
    assert text[1].strip().startswith("c=2 ") and text[2].strip().startswith("c=2 sql") and \
        text[3].strip().startswith(f"c=2 {BASE}")
