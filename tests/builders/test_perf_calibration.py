"""builders/perf_calibration.py: the formula on known inputs, the fit, leave-one-model-out on the committed data
(scripts/bench/data, without aiconfigurator) against the committed numbers, and both numbers in a prediction."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from builders import perf_calibration as cal
from builders.plan import BackendPrediction, PerformancePrediction, PredictedPoint
from tests.conftest import REPO

CONST = cal.Calibration(c0=-0.1, c_pp=-0.2, source="test", stated_error="test")


def _bench():
    path = REPO / "scripts" / "bench" / "bench_prediction.py"
    spec = importlib.util.spec_from_file_location("bench_prediction", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_factor_on_known_inputs():
    assert cal.factor(CONST, 1) == pytest.approx(math.exp(-0.1))
    assert cal.factor(CONST, 8) == pytest.approx(math.exp(-0.1) * 8 ** -0.2)
    assert cal.factor(CONST, 8) == pytest.approx(0.5970, abs=1e-4)
    with pytest.raises(ValueError, match="pp_size"):
        cal.factor(CONST, 0)


def test_fit_recovers_the_constants_it_was_made_with():
    rows = [{"pp_size": pp, "predicted": 1000.0 * k, "published": 1000.0 * k * math.exp(-0.05 - 0.3 * math.log(pp))}
            for pp in (1, 2, 4, 8) for k in (1, 3)]
    c0, c_pp = cal.fit(rows)
    assert (c0, c_pp) == (pytest.approx(-0.05), pytest.approx(-0.3))
    # one pp_size only: c_pp cannot be told apart, so it is 0 and c0 the mean log ratio
    assert cal.fit([{"pp_size": 1, "predicted": 100.0, "published": 90.0},
                    {"pp_size": 1, "predicted": 100.0, "published": 110.0}]) == (
        pytest.approx((math.log(0.9) + math.log(1.1)) / 2), 0.0)
    with pytest.raises(ValueError, match="no points"):
        cal.fit([])


def test_leave_one_model_out_never_sees_the_scored_model():
    rows = [{"model": m, "pp_size": pp, "predicted": 100.0, "published": v}
            for m, v in (("a", 90.0), ("b", 80.0), ("c", 110.0)) for pp in (1, 2)]
    base = cal.leave_one_model_out(rows)
    moved = cal.leave_one_model_out([{**r, "published": r["published"] * 3} if r["model"] == "a" else r
                                     for r in rows])
    assert [o["calibrated"] for o in base[:2]] == [o["calibrated"] for o in moved[:2]]  # a's own numbers unused
    assert base[2]["calibrated"] != moved[2]["calibrated"]  # but b's fit used a's
    assert base[0]["held_out"] == "a" and base[0]["calibrated"] == pytest.approx(100.0 * math.exp((
        math.log(0.8) + math.log(1.1)) / 2))


def test_at_capacity_interpolates_on_the_grid():
    grid = [(64, 1000.0), (128, 1600.0), (256, 2000.0)]
    assert cal.at_capacity(grid, 128) == 1600.0
    assert cal.at_capacity(grid, 96) == pytest.approx(1000.0 * 1.5 ** (math.log(1.6) / math.log(2)))
    assert cal.at_capacity(grid, 512) == pytest.approx(2000.0 * 2 ** (math.log(2000 / 1600) / math.log(2)))
    assert cal.at_capacity(grid, 32) == pytest.approx(500.0)  # below the grid: in proportion to the batch
    assert cal.at_capacity([(64, 1000.0), (128, 900.0)], 200) == 1000.0  # past the peak: the best within
    assert cal.at_capacity([], 10) is None and cal.at_capacity(grid, 0) is None


def test_lomo_reproduces_the_committed_table_from_the_committed_data():
    bench = _bench()
    _, points = bench.load_points()
    answers = json.loads(bench.ANSWERS.read_text())["answers"]
    table, uncovered = bench.rows(points, answers)
    committed = json.loads((REPO / "docs" / "benchmarks" / "prediction.json").read_text())
    assert len(table) == len(committed["validation"]) and len(uncovered) == len(committed["not_covered"])
    for mine, theirs in zip(table, committed["validation"]):
        assert (mine["model"], mine["gpu"], mine["isl"], mine["osl"]) == (
            theirs["model"], theirs["gpu"], theirs["isl"], theirs["osl"])
        assert mine["aiconfigurator"] == theirs["aiconfigurator"]
        if theirs["calibrated"] is None:
            assert mine["calibrated"] is None, mine["model"]
        else:
            assert mine["calibrated"] == pytest.approx(theirs["calibrated"], abs=0.05)
    assert bench.summaries(table) == committed["summary"]
    # the shipped constants are the fit over every dense point
    shipped = cal.load()
    assert bench.fit_constants(table, committed["summary"])["c0"] == shipped.c0
    assert bench.fit_constants(table, committed["summary"])["c_pp"] == shipped.c_pp


def test_every_recorded_point_names_its_source():
    bench = _bench()
    meta, points = bench.load_points()
    assert meta["source"]["commit"].startswith("00f37686") and meta["source"]["file"].endswith("perf-overview.md")
    assert len(points) == 328 and all(p["output_tok_s"] > 0 and p["system"] in meta["device_memory_bytes"]
                                      for p in points)


def _prediction(method="aiconfigurator") -> PerformancePrediction:
    pt = PredictedPoint(concurrency=64, ttft_ms=200.0, tpot_ms=6.0, request_latency_ms=6200.0,
                        output_tokens_per_s=10000.0, output_tokens_per_s_per_gpu=5000.0,
                        output_tokens_per_s_per_user=160.0)
    return PerformancePrediction(available=True, method=method, backends=[
        BackendPrediction(backend="trtllm", points=[pt]), BackendPrediction(backend="vllm", points=[pt])])


def test_apply_keeps_aiconfigurators_number_beside_the_calibrated_one(tmp_path):
    consts = tmp_path / "c.json"
    consts.write_text(json.dumps({"c0": -0.1, "c_pp": -0.2, "source": "s", "stated_error": "e"}))
    out = cal.apply(_prediction(), 2, False, consts)
    trt, vllm = out.backends[0].points[0], out.backends[1].points[0]
    f = math.exp(-0.1 - 0.2 * math.log(2))
    assert trt.output_tokens_per_s == 10000.0
    assert trt.output_tokens_per_s_calibrated == pytest.approx(10000 * f, abs=0.1)
    assert trt.output_tokens_per_s_per_gpu_calibrated == pytest.approx(5000 * f, abs=0.1)
    assert vllm.output_tokens_per_s_calibrated is None  # the published numbers are TensorRT-LLM's
    assert out.calibration_factor == pytest.approx(f, abs=1e-4) and "calibrated" in out.calibration
    dumped = json.loads(out.model_dump_json())["backends"][0]["points"][0]
    assert dumped["output_tokens_per_s"] == 10000.0 and dumped["output_tokens_per_s_calibrated"] > 0


def test_moe_with_attention_dp_takes_its_own_constants(tmp_path):
    consts = tmp_path / "c.json"
    consts.write_text(json.dumps({"c0": -0.1, "c_pp": 0.0, "source": "s", "stated_error": "e",
                                  "moe_attention_dp": {"c0": -0.3, "c_pp": -0.2, "source": "m", "stated_error": "em"}}))
    out = cal.apply(_prediction(), 2, True, consts, attention_dp=True)
    f = math.exp(-0.3 - 0.2 * math.log(2))
    assert out.calibration_factor == pytest.approx(f, abs=1e-4) and "moe_attention_dp" in out.calibration
    assert "em" in out.calibration and out.backends[0].points[0].output_tokens_per_s_calibrated == \
        pytest.approx(10000 * f, abs=0.1)
    assert cal.apply(_prediction(), 2, False, consts, attention_dp=True).calibration_factor == \
        pytest.approx(math.exp(-0.1), abs=1e-4)  # a dense model's attention DP changes nothing here
    moe = cal.load(which="moe_attention_dp")
    assert cal.factor_for(1, True, attention_dp=True) == pytest.approx(cal.factor(moe, 1))
    dense_only = tmp_path / "d.json"
    dense_only.write_text(json.dumps({"c0": -0.1, "c_pp": 0.0, "source": "s", "stated_error": "e"}))
    missing = cal.apply(_prediction(), 1, True, dense_only, attention_dp=True)
    assert "not a calibration file for moe_attention_dp" in missing.calibration and missing.calibration_factor is None
    with pytest.raises(ValueError, match="unknown calibration regime"):
        cal.load(consts, "moe")


def test_apply_refuses_moe_and_leaves_other_methods_alone(tmp_path):
    moe = cal.apply(_prediction(), 1, True)
    assert "mixture-of-experts" in moe.calibration and moe.calibration_factor is None
    assert moe.backends[0].points[0].output_tokens_per_s_calibrated is None
    assert cal.apply(_prediction("roofline"), 1, False) == _prediction("roofline")
    broken = tmp_path / "bad.json"
    broken.write_text("{}")
    out = cal.apply(_prediction(), 1, False, broken)
    assert "bench_prediction.py --fit" in out.calibration and out.backends[0].points[0].output_tokens_per_s_calibrated \
        is None
    assert cal.factor_for(1, True) is None and cal.factor_for(4, False) == pytest.approx(cal.factor(cal.load(), 4))
