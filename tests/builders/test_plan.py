"""The planner's numbers against hand computation, shipped builds x targets, and a rule property test."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from plugins.errors import SpecError
from builders.plan import GIB, GPU_RUNTIME_RESERVE_BYTES, compute_plan
from builders.preflight import make_plan
from builders.spec import BuildSettings, ModelSource, ResolvedBuild, load_spec
from plugins.targets import get_target, registry
from tests.conftest import hf_config

ROOT = Path(__file__).resolve().parents[2]


def _build(target: str, **settings) -> ResolvedBuild:
    return ResolvedBuild(name="t", target=target, spec_path="<test>", model=ModelSource(),
                         settings=BuildSettings.model_validate(settings))


def _trt(quant="none", kv=None, tp=1, pp=1, dtype="float16", **limits) -> dict:
    lim = {"max_batch_size": 16, "max_input_len": 2048, "max_seq_len": 4096, "max_num_tokens": 4096}
    lim.update(limits)
    return {"runtime": "trtllm", "dtype": dtype, "quantization": {"quant_algo": quant, "kv_cache_quant_algo": kv},
            "parallelism": {"tp_size": tp, "pp_size": pp}, "limits": lim}


# --- KV bytes per token per rank: 2 x layers/pp x max(1, kv/tp) x head_dim x bytes -------------

@pytest.mark.parametrize("tp,pp,expected", [
    (1, 1, 2 * 30 * 3 * 64 * 2),   # 23040
    (3, 1, 2 * 30 * 1 * 64 * 2),   # 7680: 3 KV heads over 3 ranks
    (9, 1, 2 * 30 * 1 * 64 * 2),   # 7680: 3 KV heads duplicated up to 9 ranks, one each
    (1, 2, 2 * 15 * 3 * 64 * 2),   # 11520
    (3, 2, 2 * 15 * 1 * 64 * 2),   # 3840
])
def test_kv_bytes_per_token_smollm2(smollm2, tp, pp, expected):
    plan = compute_plan(_build("h200", **_trt(tp=tp, pp=pp)), get_target("h200"), smollm2)
    assert plan.memory.kv.bytes_per_token == expected


@pytest.mark.parametrize("kv,tp,pp,expected", [
    (None, 1, 1, 131072),            # 2*32*8*128*2 = 128 KiB
    ("fp8", 1, 1, 65536),            # 64 KiB
    (None, 2, 1, 2 * 32 * 4 * 128 * 2),
    (None, 1, 2, 2 * 16 * 8 * 128 * 2),
    (None, 2, 2, 2 * 16 * 4 * 128 * 2),   # 32768
    ("fp8", 2, 2, 2 * 16 * 4 * 128 * 1),  # 16384
    (None, 16, 1, 2 * 32 * 1 * 128 * 2),  # 8 KV heads duplicated over 16 ranks
])
def test_kv_bytes_per_token_llama3_8b(llama3_8b, kv, tp, pp, expected):
    quant = "fp8" if kv else "none"
    plan = compute_plan(_build("h200", **_trt(quant=quant, kv=kv, tp=tp, pp=pp, dtype="bfloat16")),
                        get_target("h200"), llama3_8b)
    assert plan.memory.kv.bytes_per_token == expected


def test_portable_runtime_on_cpu_uses_float32_kv(smollm2):
    plan = compute_plan(_build("cpu"), get_target("cpu"), smollm2)
    assert plan.memory.kv.bytes_per_token == 2 * 30 * 3 * 64 * 4


# --- weights ----------------------------------------------------------------------------------

def test_weights_llama3_8b_fp8(llama3_8b):
    plan = compute_plan(_build("h100", **_trt(quant="fp8", dtype="bfloat16")), get_target("h100"), llama3_8b)
    per_layer = 4096 * (32 + 2 * 8) * 128 + 4096 * 4096 + 3 * 4096 * 14336   # 218,103,808 params
    b = plan.memory.weights_breakdown
    assert b["layers"] == 32 * per_layer * 1                                    # FP8: 1 B/param
    assert b["scales"] == 32 * 5 * 8                                           # 2 FP32 scalars per linear
    assert b["embedding"] == b["lm_head"] == 128256 * 4096 * 2                 # stay 16-bit
    assert b["norms"] == 32 * 2 * 4096 * 2 + 4096 * 2
    assert plan.memory.weights_bytes_per_rank == 9_081_201_920


def test_weights_llama3_8b_int4_awq_tp2(llama3_8b):
    plan = compute_plan(_build("h100", **_trt(quant="int4_awq", dtype="bfloat16", tp=2)), get_target("h100"),
                        llama3_8b)
    # per rank: qkv 4096x3072, dense 2048x4096, fc/gate 4096x7168, proj 7168x4096 (in x out)
    shards = [(4096, 3072), (2048, 4096), (4096, 7168), (4096, 7168), (7168, 4096)]
    weights = sum(i * o // 2 for i, o in shards)                               # 0.5 B/param
    scales = sum(o * (i // 128) * 4 + i * 2 for i, o in shards)  # fp32 group scales + 16-bit prequant scale
    b = plan.memory.weights_breakdown
    assert (b["layers"], b["scales"]) == (32 * weights, 32 * scales) == (32 * 54_525_952, 32 * 3_450_880)
    # ModelOpt's export shards the embedding over tp too (use_parallel_embedding, sharding dim 0)
    assert b["lm_head"] == 128256 // 2 * 4096 * 2 and b["embedding"] == 128256 // 2 * 4096 * 2


def test_pipeline_parallel_splits_embedding_and_lm_head(llama3_8b):
    plan = compute_plan(_build("h100", **_trt(quant="fp8", dtype="bfloat16", pp=2)), get_target("h100"),
                        llama3_8b)
    first, last = plan.memory.weights_bytes_by_pp_rank
    assert last - first == 4096 * 2    # both stages hold 16 layers; embedding and lm_head are equal; + ln_f
    assert plan.memory.weights_bytes_per_rank == last


def test_vocab_padding_counted(smollm2):
    cfg = dict(smollm2, vocab_size=49153)
    plan = compute_plan(_build("h200", **_trt(tp=3)), get_target("h200"), cfg)
    assert plan.vocab_padded == 49155
    assert plan.memory.weights_breakdown["lm_head"] == 49155 // 3 * 576 * 2
    assert any("padded to 49155" in w for w in plan.warnings)


# --- activations and the KV pool ----------------------------------------------------------------

def test_activations_and_kv_pool_llama3_8b_h100(llama3_8b):
    plan = compute_plan(_build("h100", **_trt(quant="fp8", kv="fp8", dtype="bfloat16")), get_target("h100"),
                        llama3_8b)
    m = plan.memory
    width = 2 * 4096 + (32 + 16) * 128 + 32 * 128 + 3 * 14336
    assert m.activation_bytes == 4096 * 2 * width + 16 * 1 * 128256 * 4 == 511_524_864
    free = int(79.6 * GIB) - GPU_RUNTIME_RESERVE_BYTES - m.weights_bytes_per_rank - m.activation_bytes
    assert m.free_bytes_after_weights_and_activations == free
    assert m.kv.pool_bytes == int(free * 0.9)
    assert m.kv.blocks == m.kv.pool_bytes // (65536 * 32)
    assert m.kv.blocks_per_max_seq == 4096 // 32
    assert m.kv.max_seq_len_sequences == m.kv.blocks // 128
    assert m.kv.workload_sequences == m.kv.blocks // (256 // 32)
    assert m.kv.workload_concurrency == 16
    assert m.total_bytes <= m.device_bytes


def test_kv_pool_cap_and_cpu_pool(smollm2):
    capped = compute_plan(_build("h200", **_trt(), serving={"max_tokens_in_paged_kv_cache": 10_000}),
                          get_target("h200"), smollm2)
    assert capped.memory.kv.pool_bytes == 10_000 * 23040
    assert capped.memory.kv.capacity_tokens == 10_000 // 32 * 32
    cpu = compute_plan(_build("cpu"), get_target("cpu"), smollm2)
    assert cpu.memory.kv.pool_bytes == 8 * 2048 * 46080


def test_isl_osl_change_workload_only(smollm2):
    a = compute_plan(_build("h200", **_trt()), get_target("h200"), smollm2, isl=128, osl=128)
    b = compute_plan(_build("h200", **_trt()), get_target("h200"), smollm2, isl=1024, osl=1024)
    assert a.memory.kv.blocks == b.memory.kv.blocks
    assert a.memory.kv.workload_sequences == a.memory.kv.blocks // (256 // 32)
    assert b.memory.kv.workload_sequences == a.memory.kv.blocks // (2048 // 32)


def test_plan_serialises_with_plugins_and_reasons(smollm2, tmp_path):
    plan = compute_plan(_build("h200", **_trt(), serving={"enable_kv_cache_reuse": True}), get_target("h200"),
                        smollm2)
    data = json.loads(plan.write(tmp_path / "plan.json").read_text())
    flags = {p["flag"]: p for p in data["plugins"]}
    assert flags["use_paged_context_fmha"]["value"] == "enable" and flags["use_paged_context_fmha"]["reason"]
    assert data["memory"]["kv"]["bytes_per_token"] == 23040


# --- every shipped build x each of its targets loads and plans ----------------------------------

ASSET_FOR_SOURCE = {"embedded:smollm2-135m-instruct": "smollm2-135m"}
SHIPPED = [(p, t) for p in sorted((ROOT / "configs" / "builds").glob("*.yaml"))
           for t in (yaml.safe_load(p.read_text()).get("targets") or {"cpu": {}})]


@pytest.mark.parametrize("path,target", SHIPPED, ids=[f"{p.stem}-{t}" for p, t in SHIPPED])
def test_shipped_build_plans(path, target):
    build = load_spec(path, target)
    src = build.model.source
    if build.model.hf_config:  # the stored config.json of the real model (tests/assets)
        config = json.loads(Path(build.model.hf_config).read_text())
    else:
        config = hf_config(ASSET_FOR_SOURCE[src])
    plan = make_plan(build, get_target(target), config)
    assert plan.memory.kv.max_seq_len_sequences >= 1
    assert plan.memory.total_bytes <= plan.memory.device_bytes


# --- property: every plan the planner accepts satisfies the rules -------------------------------

def _grid():
    targets = ["cpu", "a10", "a100-80gb", "l40s", "h100", "b200"]
    for model, target, quant, kv, tp, pp, seq in itertools.product(
            ["smollm2-135m", "llama-3-8b"], targets, ["none", "fp8", "int4_awq", "w4a8_awq"], [None, "fp8"],
            [1, 2, 3, 8], [1, 2, 4], [2048, 16384]):
        runtime = "pytorch" if target == "cpu" else "trtllm"
        yield model, target, {"runtime": runtime, "dtype": "bfloat16",
                              "quantization": {"quant_algo": quant, "kv_cache_quant_algo": kv, "group_size": 64},
                              "parallelism": {"tp_size": tp, "pp_size": pp},
                              "limits": {"max_batch_size": 32, "max_input_len": 1024, "max_seq_len": seq,
                                         "max_num_tokens": 2048}}


def test_every_accepted_plan_satisfies_the_rules():
    accepted = rejected = 0
    configs = {m: hf_config(m) for m in ("smollm2-135m", "llama-3-8b")}
    for model, target_name, settings in _grid():
        cfg, target = configs[model], registry()[target_name]
        try:
            plan = make_plan(_build(target_name, **settings), target, cfg)
        except SpecError:
            rejected += 1
            continue
        accepted += 1
        q, par = settings["quantization"], settings["parallelism"]
        engine = settings["runtime"] != "pytorch"
        assert settings["runtime"] in target.runtimes
        assert cfg["num_attention_heads"] % par["tp_size"] == 0
        assert cfg["num_hidden_layers"] % par["pp_size"] == 0
        if engine:
            assert par["tp_size"] * par["pp_size"] <= target.gpus_per_node
            if q["quant_algo"] in ("fp8", "w4a8_awq") or q["kv_cache_quant_algo"]:
                assert target.sm >= 89
            if q["quant_algo"] == "int4_awq" and settings["runtime"] == "trtllm":
                assert not 100 <= target.sm < 120
        if q["quant_algo"] in ("int4_awq", "w4a8_awq"):
            for dim in (cfg["hidden_size"], cfg["intermediate_size"] // par["tp_size"],
                        cfg["num_attention_heads"] * cfg.get("head_dim", 128) // par["tp_size"]):
                assert dim % 64 == 0
        assert settings["limits"]["max_seq_len"] <= cfg["max_position_embeddings"]
        m = plan.memory
        assert m.kv.max_seq_len_sequences >= 1
        assert m.total_bytes <= m.device_bytes
        assert m.weights_bytes_per_rank + m.activation_bytes + m.reserve_bytes < m.device_bytes
    print(f"property grid: {accepted} accepted, {rejected} rejected")
    assert accepted > 50 and rejected > 50, (accepted, rejected)   # the grid exercises both sides


# --- wiring: the CLI and run_build ---------------------------------------------------------------

def test_cli_plan_writes_plan_json(tmp_path, capsys):
    from pipeline.cli import main

    out = tmp_path / "plan.json"
    rc = main(["plan", str(ROOT / "configs/builds/llama-3-8b.yaml"), "--target", "h100", "--hf-config",
               str(ROOT / "tests/assets/llama-3-8b/config.json"), "--output", str(out), "--isl", "1024"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["memory"]["kv"]["bytes_per_token"] == 65536 and data["memory"]["kv"]["workload_isl"] == 1024
    assert "paged KV cache per rank" in capsys.readouterr().out


def test_cli_plan_rejects_bad_spec_with_status_2(tmp_path, capsys):
    from pipeline.cli import main

    spec = tmp_path / "b.yaml"
    spec.write_text("name: b\nruntime: trtllm\ntargets: {cpu: {}}\n")
    assert main(["plan", str(spec), "--target", "cpu", "--output", str(tmp_path / "p.json")]) == 2
    assert "runtime = 'trtllm': runtime 'trtllm' cannot run on target 'cpu'" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_run_build_saves_plan_before_heavy_work(tmp_path, monkeypatch, smollm2):
    import builders.model_fetch as model_fetch
    import pipeline.build as build_mod

    from tests.conftest import smollm2_tokenizer_dir

    # a whole checkpoint: the build reads the weight files' headers before the plan (builders.source_tensors)
    hf = smollm2_tokenizer_dir()
    assert json.loads((hf / "config.json").read_text())["num_hidden_layers"] == smollm2["num_hidden_layers"]
    monkeypatch.setattr(model_fetch, "resolve_source", lambda source, *a, **k: hf)
    monkeypatch.setattr(model_fetch, "folder_digest", lambda path, *a, **k: "0" * 64)
    monkeypatch.setattr(build_mod, "source_digest", lambda path: "0" * 64)  # no memo entry for the shared folder

    class Stop(Exception):
        pass

    def no_heavy_work(*a, **k):
        raise Stop

    monkeypatch.setattr(build_mod, "checkpoint_stage", no_heavy_work)
    build = load_spec(ROOT / "configs/builds/smollm2-135m.yaml", "cpu")
    with pytest.raises(Stop):
        build_mod.run_build(build, out_root=tmp_path / "out", progress=False)
    plan = json.loads((tmp_path / "out" / "smollm2-135m" / "cpu" / "plan.json").read_text())
    assert plan["memory"]["kv"]["bytes_per_token"] == 46080

    bad = load_spec(ROOT / "configs/builds/smollm2-135m.yaml", "cpu",
                    overrides={"quantization": {"group_size": 128}})
    with pytest.raises(SpecError) as err:
        build_mod.run_build(bad, out_root=tmp_path / "out2", progress=False)
    assert err.value.codes() == ["awq_group"]


def test_cli_plan_runtime_settings_fit_a_narrow_terminal(monkeypatch, capsys):
    """80 columns: whole setting names, each reason after the table, no line cut off."""
    from pipeline.cli import main
    from plugins.runtimes import PORTABLE_RUNTIME_CHOICES

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", str(ROOT / "configs/builds/smollm2-135m.yaml"), "--target", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    for name, value, reason in PORTABLE_RUNTIME_CHOICES:
        assert any(line.startswith(f"  {name}: {reason.split()[0]}") for line in lines), name
        assert any(f"│ {name} " in line for line in lines), name


def test_the_plan_states_the_admission_capacity(tmp_path, capsys, monkeypatch):
    """The default build admits limits.max_batch_size in flight + serving.max_queue_size queued; `trtpipe plan`
    says so, and that more are refused as overloaded. With max_queue_size 0 there is no limit to state."""
    from pipeline.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # the table's cell on one line
    spec = ROOT / "configs/builds/smollm2-135m.yaml"
    build = load_spec(spec, "cpu")
    lim, sv = build.settings.limits, build.settings.serving
    out = tmp_path / "plan.json"
    assert main(["plan", str(spec), "--target", "cpu", "--output", str(out)]) == 0
    admission = json.loads(out.read_text())["admission"]
    assert admission == {"in_flight": lim.max_batch_size, "queued": sv.max_queue_size,
                         "capacity": lim.max_batch_size + sv.max_queue_size}
    text = " ".join(capsys.readouterr().out.split())
    assert (f"{lim.max_batch_size} in flight (limits.max_batch_size) + {sv.max_queue_size} queued "
            f"(serving.max_queue_size) = {lim.max_batch_size + sv.max_queue_size} requests at once; more concurrent "
            "requests are refused as overloaded") in text
    unbounded = build.settings.model_copy(update={"serving": sv.model_copy(update={"max_queue_size": 0})})
    from tests.conftest import hf_config
    plan = compute_plan(build.model_copy(update={"settings": unbounded}), get_target("cpu"), hf_config("smollm2-135m"))
    assert plan.admission.capacity is None and "none is refused as overloaded" in plan.admission.text()
