"""The aiconfigurator adapter (builders/perf_model.py) against the real library in .aiconfigurator/ (make setup).

The registries' mappings are checked against facts recorded from aiconfigurator 0.12.0 and those facts against the
installed library; predictions are asked of the library itself (a fresh cache per module, so they are computed).
"""

from __future__ import annotations

import json

import pytest

from builders import perf_calibration, perf_model, preflight
from builders.spec import load_spec
from plugins.architectures import ARCHITECTURES
from plugins.recipes import QUANT_RECIPES
from plugins.targets import get_target, registry
from tests.conftest import REPO, hf_config

FACTS = json.loads((REPO / "tests" / "facts" / "aiconfigurator_0_12_0" / "info.json").read_text())
LLAMA = REPO / "configs" / "builds" / "llama-3-8b.yaml"


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TRTPIPE_CACHE", str(tmp_path_factory.mktemp("aic-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def live_info():
    return perf_model.info()


def test_recorded_facts_are_the_installed_library(live_info):
    assert live_info["aiconfigurator"] == perf_model.AICONFIGURATOR_VERSION == FACTS["aiconfigurator"]
    assert live_info["aiconfigurator_core"] == FACTS["aiconfigurator_core"]
    assert {a: live_info["architectures"].get(a) for a in FACTS["architectures"]} == FACTS["architectures"]
    assert live_info["systems"] == FACTS["systems"]
    assert live_info["gemm_quant_modes"] == FACTS["gemm_quant_modes"]
    assert live_info["moe_quant_modes"] == FACTS["moe_quant_modes"]


def test_registries_map_only_to_what_the_library_has():
    modeled = {a for a, fam in FACTS["architectures"].items() if fam}
    assert {a.name for a in ARCHITECTURES.values() if a.aiconfigurator} == modeled
    assert set(FACTS["architectures"]) == set(ARCHITECTURES)  # every family of ours was looked up
    for r in QUANT_RECIPES.values():
        assert r.aiconfigurator_gemm is None or r.aiconfigurator_gemm in FACTS["gemm_quant_modes"], r.name
        assert r.aiconfigurator_moe is None or r.aiconfigurator_moe in FACTS["moe_quant_modes"], r.name
    for t in registry().values():
        assert t.aiconfigurator_system is None or t.aiconfigurator_system in FACTS["systems"], t.name
    # the system a GPU target names is that GPU: same memory class (A100 40 GB has no system of its own)
    assert get_target("a100-40gb").aiconfigurator_system is None
    assert get_target("h200").aiconfigurator_system == "h200_sxm"
    # the estimate-only systems are those without a database of any framework
    assert perf_model.ESTIMATE_ONLY == {s for s, dbs in FACTS["systems"].items() if not any(dbs.values())}


@pytest.mark.parametrize("target, runtime, quant, family, reason", [
    ("h200", "pytorch", None, "llama-3-8b", "runtime pytorch is not TensorRT-LLM"),
    ("cpu", "trtllm", None, "llama-3-8b", "has no system for target cpu"),
    ("a10", "trtllm", None, "llama-3-8b", "has no system for target a10"),
    ("l4", "trtllm", None, "llama-3-8b", "has no database for target l4"),
    ("h200", "trtllm", "w4a8_awq", "llama-3-8b", "no GEMM mode for quant_algo w4a8_awq"),
    ("h200", "trtllm-llmapi", None, "gemma-2-9b", "does not model Gemma2ForCausalLM"),
    ("h200", "trtllm-llmapi", None, "mistral-7b", "does not model MistralForCausalLM"),
])
def test_what_cannot_be_modeled_is_named(target, runtime, quant, family, reason):
    overrides = {"runtime": runtime}
    if quant:
        overrides["quantization"] = {"quant_algo": quant, "kv_cache_quant_algo": None}
    build = load_spec(LLAMA, "h100" if target in ("cpu", "a10") else target, overrides)
    t = get_target(target)
    assert reason in perf_model.refusal(build, t, hf_config(family))


def test_nothing_refused_for_the_llama_build_on_h200():
    build = load_spec(LLAMA, "h200")
    assert perf_model.refusal(build, get_target("h200"), hf_config("llama-3-8b")) == ""


def test_concurrencies_reach_the_plans_in_flight_sequences():
    assert perf_model.concurrencies(256) == [1, 4, 16, 64, 256]
    assert perf_model.concurrencies(100) == [1, 4, 16, 64, 100]
    assert perf_model.concurrencies(1) == [1]
    assert perf_model.concurrencies(0) == []
    assert perf_model.concurrencies(32, 4) == [4, 16, 32]  # attention DP over 4 ranks: the same batch on each


def test_attention_dp_is_predicted_per_rank(fresh_cache, tmp_path):
    """parallelism.enable_attention_dp: aiconfigurator gets attention tp 1 x attention DP tp_size and one rank's
    batch; its concurrency is every rank's, which is what the plan's point says."""
    spec = tmp_path / "q.yaml"
    spec.write_text((REPO / "configs" / "builds" / "qwen3-30b-a3b.yaml").read_text()
                    .replace("  tp_size: 1\n", "  tp_size: 4\n  moe_ep_size: 4\n  enable_attention_dp: true\n")
                    .replace("../../", str(REPO) + "/"))
    build, target, cfg = load_spec(spec, "h200"), get_target("h200"), hf_config("qwen3-30b-a3b")
    plan = preflight.make_plan(build, target, cfg, isl=1000, osl=1000)
    perf = perf_model.predict_plan(build, target, plan, cfg, backends=("trtllm",))
    assert perf.available, perf.reason
    assert (perf.inputs["tp_size"], perf.inputs["attention_dp_size"], perf.inputs["moe_ep_size"]) == (1, 4, 4)
    points = perf.backends[0].points
    assert [p.concurrency for p in points] == perf_model.concurrencies(plan.memory.kv.workload_concurrency, 4)
    assert all(p.concurrency % 4 == 0 for p in points) and points[-1].concurrency == 4 * 256
    # MoE with attention DP: its own fitted constants (the published MoE runs' option)
    moe = perf_calibration.load(which="moe_attention_dp")
    assert perf.calibration_factor == pytest.approx(perf_calibration.factor(moe, 1), abs=1e-4)
    assert "moe_attention_dp" in perf.calibration


def test_plan_predictions_from_the_library(fresh_cache):
    build, target, cfg = load_spec(LLAMA, "h200"), get_target("h200"), hf_config("llama-3-8b")
    plan = preflight.make_plan(build, target, cfg, isl=1000, osl=1000)
    perf = perf_model.predict_plan(build, target, plan, cfg)
    assert perf.available and not perf.cached, perf.reason
    assert perf.system == "h200_sxm" and (perf.isl, perf.osl) == (1000, 1000)
    assert perf.inputs["gemm_quant_mode"] == "fp8_static" and perf.inputs["kvcache_quant_mode"] == "fp8"
    by = {b.backend: b for b in perf.backends}
    assert set(by) == {"trtllm", "vllm", "sglang"}
    trt = by["trtllm"]
    assert trt.version == FACTS["systems"]["h200_sxm"]["trtllm"] and trt.database_mode == "SILICON"
    assert 0.5 < trt.measured_share <= 1
    concs = [p.concurrency for p in trt.points]
    assert concs == perf_model.concurrencies(plan.memory.kv.workload_concurrency)
    tput = [p.output_tokens_per_s for p in trt.points]
    tpot = [p.tpot_ms for p in trt.points]
    assert tput == sorted(tput) and tpot == sorted(tpot)  # batching buys throughput with per-token latency
    p1 = trt.points[0]
    assert p1.request_latency_ms == pytest.approx(p1.ttft_ms + (1000 - 1) * p1.tpot_ms, rel=0.02)
    # SGLang 0.5.14's H200 database has no context attention with an FP8 KV cache: no prediction, and why
    assert not by["sglang"].points and "context attention" in by["sglang"].error
    assert by["vllm"].points
    # the same inputs again: answered from the cache
    again = perf_model.predict_plan(build, target, plan, cfg)
    assert again.cached and again.backends == perf.backends


def test_a_missing_library_gives_the_labelled_roofline_estimate(monkeypatch, tmp_path):
    """Without aiconfigurator (tools not installed yet) the plan still estimates, labelled, and says why."""
    monkeypatch.setenv("TRTPIPE_AICONFIGURATOR_PYTHON", str(tmp_path / "nope" / "python"))
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))
    build, target, cfg = load_spec(LLAMA, "h200"), get_target("h200"), hf_config("llama-3-8b")
    plan = preflight.make_plan(build, target, cfg)
    perf = perf_model.predict_plan(build, target, plan, cfg)
    assert perf.available and perf.method == "roofline" and "TRTPIPE_AICONFIGURATOR_PYTHON" in perf.reason
    assert [b.backend for b in perf.backends] == ["trtllm"] and perf.backends[0].points
    assert perf.calibration == ""  # the correction is aiconfigurator's, not the estimate's


def test_the_worker_reports_a_failed_process(monkeypatch, tmp_path):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: aiconfigurator' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TRTPIPE_AICONFIGURATOR_PYTHON", str(fake))
    with pytest.raises(perf_model.PerfModelUnavailable, match="exited 3.*ModuleNotFoundError"):
        perf_model.run_worker({"op": "info"})


def test_plan_predicts_tensorrt_llm_alone_unless_asked(tmp_path, capsys):
    """`trtpipe plan` loads TensorRT-LLM's database only (each framework's costs seconds cold);
    --compare-frameworks adds vLLM and SGLang, and the table says how."""
    from pipeline.cli import main

    plan_json = tmp_path / "plan.json"
    assert main(["plan", str(LLAMA), "--target", "h200", "--isl", "1000", "--osl", "1000", "--no-progress",
                 "--output", str(plan_json)]) == 0
    out = capsys.readouterr().out
    assert "trtpipe plan --compare-frameworks" in out
    assert "calibrated" in out  # the table's column and the note (wrapped at the test's width)
    perf = json.loads(plan_json.read_text())["performance"]
    assert [b["backend"] for b in perf["backends"]] == ["trtllm"]
    # plan.json keeps aiconfigurator's number and the calibrated one beside it (builders/perf_calibration.py)
    f = perf_calibration.factor_for(1, False)
    assert perf["calibration_factor"] == pytest.approx(f, abs=1e-4) and "leave one model out" in perf["calibration"]
    for p in perf["backends"][0]["points"]:
        assert p["output_tokens_per_s_calibrated"] == pytest.approx(p["output_tokens_per_s"] * f, abs=0.1)
    assert main(["plan", str(LLAMA), "--target", "h200", "--isl", "1000", "--osl", "1000", "--no-progress",
                 "--output", str(plan_json), "--compare-frameworks"]) == 0
    assert "--compare-frameworks" not in capsys.readouterr().out
    perf = json.loads(plan_json.read_text())["performance"]
    assert [b["backend"] for b in perf["backends"]] == ["trtllm", "vllm", "sglang"]
