"""Rules that are refused up front (before any stage runs), with fixes that name only values that work, and the
planner's warnings about KV-bound batches and memory headroom."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest

from builders import preflight
from builders.model_shape import ModelShape, rope_context
from builders.plan import compute_plan
from builders.plan_warnings import HEADROOM_WARN_FRACTION
from builders.spec import BuildSettings, ModelSource, ResolvedBuild, load_spec
from pipeline.build import run_build
from plugins.errors import SpecError
from plugins.targets import get_target
from tests.conftest import ASSETS, hf_config


def _build(target: str, **settings) -> ResolvedBuild:
    return ResolvedBuild(name="t", target=target, spec_path="<test>", model=ModelSource(),
                         settings=BuildSettings.model_validate(settings))


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "b.yaml"
    p.write_text(text)
    return p


# --- 1. the portable runtime serves decoupled only: a spec rule, checked before any stage ----------------------

@pytest.mark.parametrize("yaml_text,target,expected", [
    ("serving: {streaming: false}\ntargets: {cpu: {}}", "cpu", [("serving.streaming", False)]),
    ("serving: {streaming: false, decoupled: false}\ntargets: {cpu: {}}", "cpu", [("serving.decoupled", False)]),
    ("targets: {cpu: {serving: {streaming: false}}}", "cpu", [("targets.cpu.serving.streaming", False)]),
    ("serving: {streaming: false, decoupled: true}\ntargets: {cpu: {}}", "cpu", []),  # one answer, decoupled
    ("runtime: trtllm\nquantization: {quant_algo: fp8}\nserving: {streaming: false}\ntargets: {h100: {}}", "h100",
     []),
])
def test_portable_runtime_without_decoupled_is_a_spec_rule(tmp_path, yaml_text, target, expected):
    build = load_spec(_write(tmp_path, f"name: b\n{yaml_text}\n"), target)
    problems = [p for p in preflight.spec_problems(build, get_target(target)) if p.code == "pytorch_needs_decoupled"]
    assert [(p.field, p.value) for p in problems] == expected
    for p in problems:
        assert "decoupled" in p.rule and "serving.streaming: true" in p.fix


def test_plan_refuses_pytorch_without_streaming(tmp_path, capsys):
    from pipeline.cli import main

    spec = _write(tmp_path, f"name: b\nmodel: {{source: {tmp_path / 'absent'}, hf_config: "
                            f"{ASSETS / 'smollm2-135m' / 'config.json'}}}\nserving: {{streaming: false}}\n")
    assert main(["plan", str(spec), "--target", "cpu", "--output", str(tmp_path / "p.json")]) == 2
    assert "serving.streaming = False: the pytorch runtime serves decoupled" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


def test_build_refuses_pytorch_without_streaming_before_reading_the_model(tmp_path):
    """The model folder is empty: reading it would fail with another problem. The spec rule stops first."""
    (tmp_path / "model").mkdir()
    build = load_spec(_write(tmp_path, f"name: b\nmodel: {{source: {tmp_path / 'model'}}}\n"
                                       "serving: {streaming: false}\n"), "cpu")
    with pytest.raises(SpecError) as err:
        run_build(build, out_root=tmp_path / "out", progress=False)
    assert err.value.codes() == ["pytorch_needs_decoupled"]
    assert not (tmp_path / "out").exists()


# --- 2. rope scaling extends the context only so far ---------------------------------------------------------

def _with(asset: str, **keys) -> dict:
    cfg = copy.deepcopy(hf_config(asset))
    cfg.update(keys)
    return cfg


LONGROPE = {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}
ROPE_CASES = [  # (config, the longest max_seq_len it allows)
    (hf_config("llama-3.1-8b"), 131072),   # llama3 factor 8: max_position_embeddings already extended
    (hf_config("llama-3.2-1b"), 131072),   # llama3 factor 32 over 8192 would be 262144: max_position_embeddings wins
    (_with("qwen2.5-7b", rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
     131072),
    (_with("qwen3-8b", rope_scaling={"rope_type": "yarn", "factor": 2.0}), 81920),  # no original: max_position x 2
    (_with("tiny-gqa", rope_scaling={"rope_type": "linear", "factor": 2.0}), 8192),
    (_with("tiny-gqa", rope_scaling={"rope_type": "dynamic", "factor": 4.0}), 16384),
    (_with("phi-3-mini", max_position_embeddings=131072, rope_scaling=LONGROPE), 131072),
    (_with("llama-3-8b", rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0},
                                          "sliding_attention": {"rope_type": "default"}}), 16384),
]


@pytest.mark.parametrize("cfg,limit", ROPE_CASES, ids=[f"{(c.get('rope_scaling') or c.get('rope_parameters'))}"[:40]
                                                       for c, _ in ROPE_CASES])
def test_max_seq_len_is_bounded_by_the_rope_extension(cfg, limit):
    for seq, refused in ((limit, False), (limit + 1, True)):
        build = _build("h100", runtime="trtllm-llmapi", limits={"max_input_len": 1024, "max_seq_len": seq})
        problems = [p for p in preflight.model_problems(build, cfg) if p.code == "seq_len_context"]
        assert bool(problems) is refused, (seq, problems)
        if refused:
            assert problems[0].field == "limits.max_seq_len" and problems[0].value == seq
            assert problems[0].fix == f"set limits.max_seq_len <= {limit}"


@pytest.mark.parametrize("cfg,limit", ROPE_CASES[:3])
def test_rope_context_says_how_it_was_computed(cfg, limit):
    reach, how = rope_context(cfg)
    assert reach == limit and how.startswith("rope ") and str(limit if "already" in how else "") in how


def test_no_rope_scaling_keeps_max_position_embeddings():
    assert rope_context(hf_config("llama-3-8b")) is None
    assert rope_context(hf_config("smollm2-135m")) is None  # rope_parameters of type default


def test_rope_limit_names_the_override(tmp_path):
    spec = _write(tmp_path, "name: b\nruntime: trtllm\nquantization: {quant_algo: fp8}\nlimits: {max_input_len: 1024}\n"
                            "targets: {h100: {limits: {max_seq_len: 200000}}}\n")
    with pytest.raises(SpecError) as err:
        preflight.make_plan(load_spec(spec, "h100"), get_target("h100"), hf_config("llama-3.1-8b"))
    assert ("targets.h100.limits.max_seq_len", "seq_len_context") in [(p.field, p.code) for p in err.value.problems]


# --- 4. planner warnings: full-length sequences and memory headroom -------------------------------------------

def _llama8b_trt(target: str, **limits) -> ResolvedBuild:
    lim = {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 2048}
    lim.update(limits)
    return _build(target, runtime="trtllm", dtype="bfloat16", quantization={"quant_algo": "none"}, limits=lim)


def test_warns_when_fewer_full_length_sequences_fit_than_max_batch_size():
    plan = compute_plan(_llama8b_trt("h100", max_batch_size=256, max_seq_len=8192), get_target("h100"),
                        hf_config("llama-3-8b"))
    n = plan.memory.kv.max_seq_len_sequences
    assert 1 <= n < 256
    found = [w for w in plan.warnings if "full-length" in w]
    assert len(found) == 1
    assert f"holds {n} full-length sequences" in found[0] and "max_batch_size 256" in found[0]
    assert f"lower limits.max_batch_size to {n}" in found[0] and "kv_cache_free_gpu_mem_fraction" in found[0]
    fits = compute_plan(_llama8b_trt("h100", max_batch_size=n, max_seq_len=8192), get_target("h100"),
                        hf_config("llama-3-8b"))
    assert not [w for w in fits.warnings if "full-length" in w]


def test_warns_when_weights_and_activations_leave_little_headroom():
    target = get_target("a10")
    tight = compute_plan(_llama8b_trt("a10", max_num_tokens=40960), target, hf_config("llama-3-8b"))
    m = tight.memory
    used = m.weights_bytes_per_rank + m.activation_bytes + m.reserve_bytes
    assert HEADROOM_WARN_FRACTION * m.device_bytes < used < m.device_bytes
    found = [w for w in tight.warnings if "over 90%" in w]
    assert len(found) == 1 and f"{used / m.device_bytes:.0%} of the" in found[0] and "'a10'" in found[0]
    assert "lower limits.max_num_tokens" in found[0]
    roomy = compute_plan(_llama8b_trt("a10"), target, hf_config("llama-3-8b"))
    assert not [w for w in roomy.warnings if "over 90%" in w]


# --- 6. every tp size a fix names passes every sharding rule ----------------------------------------------------

def _qwen_moe_odd_shared() -> dict:
    return _with("qwen1.5-moe-a2.7b", shared_expert_intermediate_size=5640)  # 8 x 705: tp 16 cannot split it


SHAPES = {name: hf_config(name) for name in sorted(p.name for p in ASSETS.iterdir() if (p / "config.json").is_file())
          if "eagle" not in name}
SHAPES["qwen-moe-odd-shared"] = _qwen_moe_odd_shared()
RECIPES = {"none": {"quant_algo": "none"}, "int4_awq-64": {"quant_algo": "int4_awq", "group_size": 64},
           "int4_awq-128": {"quant_algo": "int4_awq", "group_size": 128},
           "int4_awq-256": {"quant_algo": "int4_awq", "group_size": 256}}
TP_CODES = set(preflight.SHARDING_CODES) - {"layers_pp"} | {"awq_group"}


def _tp_problems(cfg: dict, quant: dict, tp: int, moe: tuple[int, int] | None = None) -> list:
    par = {"tp_size": tp} | ({"moe_tp_size": moe[0], "moe_ep_size": moe[1]} if moe else {})
    build = _build("h100", runtime="trtllm-llmapi", quantization=quant, parallelism=par)
    return [p for p in preflight.model_problems(build, cfg) if p.code in TP_CODES]


def _named_tp_sizes(cfg: dict, quant: dict) -> list[int] | None:
    """The tp sizes the heads rule's fix names, for a tp that does not divide the heads."""
    heads = cfg["num_attention_heads"]
    bad = next(t for t in range(2, 65) if heads % t)
    fix = next(p.fix for p in _tp_problems(cfg, quant, bad) if p.code == "heads_tp")
    if not fix.startswith("use tp_size in "):
        return None
    return ast.literal_eval(fix[len("use tp_size in "):])


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("model", SHAPES)
def test_every_tp_size_a_fix_names_passes_every_tp_rule(model, recipe):
    cfg, quant = SHAPES[model], RECIPES[recipe]
    named = _named_tp_sizes(cfg, quant)
    if named is None:  # no tp fits this group size at all (the fix says to change it)
        assert all(_tp_problems(cfg, quant, 1, (1, 1) if ModelShape.from_hf_config(cfg).is_moe else None))
        return
    shape = ModelShape.from_hf_config(cfg)
    group = quant.get("group_size") if quant["quant_algo"] != "none" else None
    for tp in [t for t in range(1, cfg["num_attention_heads"] + 1) if cfg["num_attention_heads"] % t == 0]:
        splits = preflight.moe_splits(shape, tp, group) if shape.is_moe else [None]
        passes = any(not _tp_problems(cfg, quant, tp, s) for s in splits)
        assert passes is (tp in named), (tp, named, [p.render() for s in splits for p in _tp_problems(cfg, quant, tp, s)])


def test_int4_group_size_narrows_the_tp_hint():
    llama = hf_config("llama-3-8b")  # down_proj input 14336 / tp: 14336 / 32 = 448 is no multiple of 128
    assert _named_tp_sizes(llama, RECIPES["none"]) == [1, 2, 4, 8, 16, 32]
    assert _named_tp_sizes(llama, RECIPES["int4_awq-128"]) == [1, 2, 4, 8, 16]
    assert _named_tp_sizes(llama, RECIPES["int4_awq-256"]) == [1, 2, 4, 8]
    assert _named_tp_sizes(_qwen_moe_odd_shared(), RECIPES["none"]) == [1, 2, 4, 8]


def test_no_tp_fits_the_group_size_says_so():
    smol = hf_config("smollm2-135m")  # hidden 576 is no multiple of 128 at any tp
    fix = next(p.fix for p in _tp_problems(smol, RECIPES["int4_awq-128"], 2) if p.code == "heads_tp")
    assert fix.startswith("no tp_size keeps every per-rank input a multiple of group_size 128") and "[1, 3]" in fix
