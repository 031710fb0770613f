"""builders/aiconfigurator_worker.py's SDK route against aiconfigurator's own ``cli_estimate`` (the installed library
in .aiconfigurator/, made by make setup).

The worker estimates through the SDK below ``aiconfigurator.cli.api`` (that module imports pandas, matplotlib and the
CLI's report writers, ~1.2 s of a cold plan). The points here come from real plans (dense and MoE, one to four GPUs,
fp8 and int4, SILICON and the HYBRID fallback, a KV pool too small, an OOM) and each answer must equal
``cli_estimate``'s, field by field.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from builders import perf_model, preflight
from builders.spec import load_spec
from plugins.targets import get_target
from tests.conftest import REPO, hf_config

BUILDS = REPO / "configs" / "builds"
NO_KV_QUANT = {"kv_cache_quant_algo": None}

CASES = [  # (build, target, overrides, isl, osl, frameworks)
    ("llama-3-8b", "h200", {}, 1000, 1000, ("trtllm",)),
    ("llama-3-8b", "h100", {"quantization": {"quant_algo": "int4_awq", **NO_KV_QUANT}, "parallelism": {"tp_size": 2},
                            "serving": {"kv_cache_free_gpu_mem_fraction": 0.1}}, 2048, 256, ("trtllm", "vllm")),
    ("qwen3-30b-a3b", "h200", {"parallelism": {"tp_size": 2, "moe_ep_size": 2}}, 512, 128, ("trtllm",)),
    ("mixtral-8x7b", "h100", {"parallelism": {"tp_size": 4}}, 1000, 500, ("trtllm",)),
]


@pytest.fixture(scope="module")
def points(tmp_path_factory) -> list[dict]:
    """The worker's points for :data:`CASES` at concurrency 1 and 64, made as ``trtpipe plan`` makes them, plus four
    built by hand that no shipped build plans: Qwen3 MoE with the expert-TP size left out and with attention DP,
    Mixtral INT4 weights (its INT4 export is refused) and Mixtral 16-bit on one H100 (out of memory)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRTPIPE_CACHE", str(tmp_path_factory.mktemp("aic-cache")))  # model_dir writes config.json there
    out = []
    for name, target_name, overrides, isl, osl, frameworks in CASES:
        build, target, cfg = load_spec(BUILDS / f"{name}.yaml", target_name, overrides), get_target(target_name), \
            hf_config(name)
        assert perf_model.refusal(build, target, cfg) == ""
        plan = preflight.make_plan(build, target, cfg, isl=isl, osl=osl)
        base = perf_model.base_point(build, target, plan, cfg)
        out += [perf_model.at_concurrency(base, b, c) for b in frameworks for c in (1, 64)]
    qwen3 = next(p for p in out if p["moe_ep_size"] == 2 and p["batch_size"] == 64)
    out.append({**qwen3, "moe_tp_size": None})  # left to the library to infer (moe_tp 1 from tp 2 / ep 2)
    out.append({**qwen3, "tp_size": 1, "attention_dp_size": 2, "batch_size": 32})  # attention DP: 32 a rank
    mixtral = next(p for p in out if p["moe_tp_size"] == 4 and p["batch_size"] == 64)
    out.append({**mixtral, "gemm_quant_mode": "int4_wo", "moe_quant_mode": "int4_wo", "kvcache_quant_mode": "bfloat16"})
    out.append({**mixtral, "tp_size": 1, "moe_tp_size": 1, "moe_ep_size": 1, "gemm_quant_mode": "bfloat16",
                "moe_quant_mode": "bfloat16"})
    yield [{**p, "id": i} for i, p in enumerate(out)]
    mp.undo()


def test_the_sdk_route_answers_as_cli_estimate_does(points):
    sdk = perf_model.run_worker({"op": "estimate", "points": points})  # the default route, as the plan asks
    reference = perf_model.run_worker({"op": "estimate", "via": "cli_api", "points": points})
    assert len(sdk) == len(reference) == len(points)
    for p, a, b in zip(points, sdk, reference):
        assert a == b, p
    # the comparison covered what it claims: answers of both modes, MoE and several GPUs, and the errors
    ok = [(p, a) for p, a in zip(points, sdk) if a["ok"]]
    assert {a["database_mode"] for _, a in ok} == {"SILICON", "HYBRID"}
    assert {a["backend"] for _, a in ok} == {"trtllm", "vllm"}
    assert any(p["moe_ep_size"] == 2 for p, _ in ok) and any(p["moe_tp_size"] == 4 for p, _ in ok)
    dp = next(a for p, a in ok if p.get("attention_dp_size") == 2)  # every rank holds its own batch of 32
    assert dp["concurrency"] == 64 and dp["num_gpus"] == 2
    assert {p["gemm_quant_mode"] for p, _ in ok} >= {"fp8_static", "int4_wo"}
    assert {p["isl"] for p, _ in ok} == {1000, 2048, 512}
    assert any(a["kv_cache_warning"] for _, a in ok)  # 64 sequences of 2304 tokens in 10% of the free memory
    assert not sdk[-1]["ok"] and sdk[-1]["error"].startswith("RuntimeError: OOM: the model does not fit in GPU memory")


def test_unknown_route_is_refused():
    with pytest.raises(perf_model.PerfModelUnavailable, match="exited 2"):
        perf_model.run_worker({"op": "estimate", "via": "nope", "points": []})


PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import aiconfigurator_worker as w
from aiconfigurator.sdk.config_builders import build_model_config
w._fast_yaml()
point, fp8_dir = json.loads(sys.argv[2]), sys.argv[3]
answer = w.estimate(point, w._Versions())
loaded = sorted(m for m in ("aiconfigurator.cli.api", "matplotlib") if m in sys.modules)
config = lambda: build_model_config(1, 1, 1, None, None, "fp8_static", "fp8")
print(json.dumps({"ok": answer["ok"], "loaded": loaded,
                  "fmha_check": [w._fmha_check_can_change(point["model_dir"], config()),
                                 w._fmha_check_can_change(fp8_dir, config())]}))
"""


def test_the_default_route_skips_the_cli_and_only_a_check_that_cannot_act(points, tmp_path):
    """What makes a cold plan cheaper: aiconfigurator.cli.api, and with it matplotlib, is not imported, and the FP8
    FMHA check (which loads the context-attention table) is skipped for our model folders (no quantization entries)
    but still runs for a checkpoint whose own config says FP8, where it can fall back to 16-bit FMHA."""
    cfg = hf_config("llama-3-8b")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8"}}))
    run = subprocess.run([str(perf_model.interpreter()), "-c", PROBE, str(perf_model.WORKER.parent),
                          json.dumps(points[0]), str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.splitlines()[-1]) == {"ok": True, "loaded": [], "fmha_check": [False, True]}


VERSIONS_PROBE = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import aiconfigurator_worker as w
import aiconfigurator.sdk.perf_database as db
w._fast_yaml()
systems = sorted({e[:-5] for root in db.get_systems_paths() for e in os.listdir(root) if e.endswith(".yaml")})
pairs = [(s, b) for s in systems + ["no_such_gpu"] for b in ("trtllm", "vllm", "sglang")]
library = {f"{s}/{b}": db.get_latest_database_version(system=s, backend=b) for s, b in pairs}
db.get_latest_database_version = lambda **_: "library"  # which answers the shortcut left to the library
ours = {f"{s}/{b}": w.latest_version(s, b) for s, b in pairs}
print(json.dumps({"library": library, "ours": ours}))
"""


def test_the_version_shortcut_answers_as_the_library_does():
    """latest_version reads the version slots instead of scanning every system; for every system the installed
    library ships (and one it does not) and every framework it gives get_latest_database_version's answer."""
    run = subprocess.run([str(perf_model.interpreter()), "-c", VERSIONS_PROBE, str(perf_model.WORKER.parent)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.splitlines()[-1])
    library, ours = got["library"], got["ours"]
    shortcut = {k for k, v in ours.items() if v != "library"}
    assert {k: ours[k] for k in shortcut} == {k: library[k] for k in shortcut}
    # every system of the plan's targets is answered by the shortcut; what it leaves has no database at all
    assert {f"{s}/{b}" for s in ("h100_sxm", "h200_sxm", "b200_sxm", "a100_sxm", "l40s")
            for b in ("trtllm", "vllm", "sglang")} <= shortcut
    assert all(library[k] is None for k in set(ours) - shortcut), {k: library[k] for k in set(ours) - shortcut}
    assert library["h200_sxm/trtllm"] == "1.3.0rc20"
