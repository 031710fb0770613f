"""The first-principles roofline estimate (builders/roofline.py): its formulas on a case worked by hand, the plan on
a target aiconfigurator has no database for, and its agreement with aiconfigurator where both answer (the real
library in .aiconfigurator/, as tests/builders/test_perf_model.py; cached answers are fine)."""

from __future__ import annotations

import json

import pytest

from builders import perf_model, preflight, roofline
from builders.spec import load_spec
from plugins.recipes import QUANT_RECIPES
from plugins.targets import get_target
from tests.conftest import REPO, hf_config

LLAMA = REPO / "configs" / "builds" / "llama-3-8b.yaml"
HALF = (0.5, 0.5)


def _inputs(**kw) -> roofline.Inputs:
    """Round numbers: 1 TB/s and 100 TFLOPS (both halved by HALF), 10 GB of weights, 100 kB of KV per token,
    10 GFLOP per token, 1 MFLOP per token attended, ISL 100, OSL 101, max_num_tokens 1000."""
    base = dict(bandwidth_bytes_per_s=1e12, peak_flops_per_s=1e14, precision="fp16", weight_bytes_per_step=10**10,
                kv_bytes_per_token=10**5, matmul_flops_per_token=1e10, attention_flops_per_token_attended=1e6,
                tp=1, pp=1, isl=100, osl=101, max_num_tokens=1000)
    return roofline.Inputs(**{**base, **kw})


def test_a_decode_step_is_bound_by_its_bytes():
    # 10 decodes at mean context 100 + 101/2 = 150.5: 1e10 + 10 x 151.5 x 1e5 = 1.01515e10 B at 0.5e12 B/s
    # = 20.303 ms; 10 x (1e10 + 1e6 x 150.5) = 1.01505e11 FLOPs at 0.5e14 = 2.03 ms: the bytes win
    assert _inputs().step_s(0, 10, HALF) == pytest.approx(0.020303)


def test_a_context_step_is_bound_by_its_flops():
    # 10 prompts of 100 tokens: 10 x (100 x 1e10 + 1e6 x 100^2 / 2) = 1.005e13 FLOPs at 0.5e14 = 201 ms;
    # bytes 1e10 + 1000 x 1e5 = 1.01e10 at 0.5e12 = 20.2 ms
    assert _inputs().step_s(10, 0, HALF) == pytest.approx(0.201)
    # 20 prompts overflow max_num_tokens 1000: two chunks, the weights read twice; FLOPs twice the above
    assert _inputs().step_s(20, 0, HALF) == pytest.approx(0.402)
    assert _inputs(peak_flops_per_s=1e18).step_s(20, 0, HALF) == pytest.approx((2e10 + 2000 * 1e5) / 0.5e12)


def test_a_point_on_the_hand_computed_case():
    inp = _inputs()
    # c = 10 fits one context step (max_num_tokens // ISL = 10 prompts): no step in flight to wait for
    p = inp.point(10, HALF)
    assert p.ttft_ms == pytest.approx(201.0)
    # OSL - 1 = 100 steps: c / n = 1 context step of 201 ms and 99 decode steps of 20.303 ms
    tpot = (201.0 + 99 * 20.303) / 100
    assert p.tpot_ms == pytest.approx(tpot)
    assert p.request_latency_ms == pytest.approx(201.0 + 100 * tpot)
    assert p.output_tokens_per_s == pytest.approx(10 * 101 / (p.request_latency_ms / 1000))
    assert p.output_tokens_per_s_per_user == pytest.approx(1000 / tpot)
    # c = 20: two groups of 10; a group waits for the step in flight (10 others decoding), then its own step
    # (10 prompts beside 10 decodes: FLOPs 1.005e13 + 10 x 1.01505e10 -> 203.03 ms)
    p20 = inp.point(20, HALF)
    assert p20.ttft_ms == pytest.approx(20.303 + 203.0301)
    # tp x pp GPUs share the tokens
    assert _inputs(tp=2).point(10, HALF).output_tokens_per_s_per_gpu == pytest.approx(
        _inputs(tp=2).point(10, HALF).output_tokens_per_s / 2)


def test_the_recipes_math_precision():
    prec = {name: roofline.precision(r) for name, r in QUANT_RECIPES.items()}
    assert prec == {"none": "fp16", "fp8": "fp8", "int4_awq": "fp16", "int4_rtn": "fp16", "int4_gptq": "fp16",
                    "w4a8_awq": "fp8", "int8_sq": "int8", "nvfp4": "fp4"}


def test_inputs_are_the_plans_numbers():
    build, target, cfg = load_spec(LLAMA, "a10"), get_target("a10"), hf_config("llama-3-8b")
    plan = preflight.make_plan(build, target, cfg, isl=512, osl=256)
    inp = roofline.inputs(plan, target)
    m = plan.memory
    assert inp.weight_bytes_per_step == m.weights_bytes_per_rank - m.weights_breakdown["embedding"]
    assert inp.kv_bytes_per_token == m.kv.bytes_per_token == 131072
    assert inp.matmul_flops_per_token == 2 * (m.params_active - 128256 * 4096)
    assert (inp.precision, inp.peak_flops_per_s, inp.bandwidth_bytes_per_s) == ("fp16", 125e12, 600e9)


def test_the_a10_plan_shows_the_estimate(tmp_path, capsys):
    """The seed's case: Llama-3-8B INT4 AWQ on one A10 at 32 users; aiconfigurator has no A10 system."""
    from pipeline.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", str(LLAMA), "--target", "a10", "--quant", "int4_awq", "--isl", "512", "--osl", "256",
                 "--no-progress", "--output", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "first-principles estimate (roofline, not aiconfigurator)" in printed
    assert "no system for target a10" in printed and "its stated error: against aiconfigurator" in printed
    assert "--compare-frameworks" not in printed
    perf = json.loads(out.read_text())["performance"]
    assert perf["available"] and perf["method"] == "roofline" and perf["source"] == roofline.LABEL
    assert perf["reason"] == "aiconfigurator 0.12.0 has no system for target a10"
    assert perf["stated_error"] == roofline.STATED_ERROR and "TPOT median" in perf["stated_error"]
    assert perf["inputs"]["precision"] == "fp16" and perf["inputs"]["tp_size"] == 1
    points = perf["backends"][0]["points"]
    assert [p["concurrency"] for p in points] == [1, 4, 16, 32]
    tput = [p["output_tokens_per_s"] for p in points]
    assert tput == sorted(tput)


def test_l4_has_no_database_so_the_estimate_answers():
    build, target, cfg = load_spec(LLAMA, "l4"), get_target("l4"), hf_config("llama-3-8b")
    plan = preflight.make_plan(build, target, cfg)
    perf = perf_model.predict_plan(build, target, plan, cfg)
    assert perf.method == "roofline" and "no database for target l4" in perf.reason
    assert perf.inputs["precision"] == "fp8" and perf.inputs["tensor_tflops"] == 242


def test_a_target_without_tensor_throughput_has_no_estimate():
    build, cfg = load_spec(LLAMA, "a10"), hf_config("llama-3-8b")
    bare = get_target("a10").model_copy(update={"tensor_tflops": None})
    plan = preflight.make_plan(build, bare, cfg)
    perf = perf_model.predict_plan(build, bare, plan, cfg)
    assert not perf.available and "no system for target a10" in perf.reason and "tensor_tflops" in perf.reason


def test_the_stated_error_is_the_recorded_benchmarks():
    """ERROR_PCT and EFFICIENCY are what scripts/bench/bench_roofline.py --fit recorded (roofline.json)."""
    import math

    recorded = json.loads((REPO / "docs" / "benchmarks" / "roofline.json").read_text())
    assert recorded["meta"]["fitted"] and tuple(recorded["meta"]["efficiency"]) == roofline.EFFICIENCY
    row = next(r for r in recorded["summary"] if (r["target"], r["quant"]) == ("all", "SILICON answers"))
    assert row["answered"] == 48
    for metric, (median, worst) in roofline.ERROR_PCT.items():
        assert round(row[metric]["median_abs_pct"]) == median, metric
        assert math.copysign(math.ceil(abs(row[metric]["worst_pct"])), row[metric]["worst_pct"]) == worst, metric


@pytest.mark.parametrize("name", ["l40s", "h100"])
def test_agreement_with_aiconfigurator_within_the_stated_error(name):
    """FP8 at 1000/1000, the plan's concurrencies: every point within the worst error the estimate states."""
    build, target, cfg = load_spec(LLAMA, name), get_target(name), hf_config("llama-3-8b")
    plan = preflight.make_plan(build, target, cfg, isl=1000, osl=1000)
    aic = perf_model.predict_plan(build, target, plan, cfg, backends=("trtllm",))
    assert aic.method == "aiconfigurator" and aic.backends[0].database_mode == "SILICON", aic.reason
    est = roofline.predict_plan(plan, target, [p.concurrency for p in aic.backends[0].points], "")
    for a, r in zip(aic.backends[0].points, est.backends[0].points):
        for metric, (_, worst) in roofline.ERROR_PCT.items():
            err = getattr(r, metric) / getattr(a, metric) - 1
            assert abs(err) <= abs(worst) / 100, (name, a.concurrency, metric, err)
