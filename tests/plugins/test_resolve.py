"""The plugin table for every quantization x shipped GPU target, against rules from TensorRT-LLM 1.2.

Rules (tensorrt_llm/builder.py, plugin/plugin.py, gptAttentionCommon of 1.x):
* gemm_plugin: off for FP8 checkpoints, auto otherwise.
* FP8 context FMHA: only FP8/W4A8_AWQ weights, only on the SMs attentionOp.cpp allows (recorded in
  tests/facts/trtllm_1_2_1/trtllm_build.json); with paged context FMHA only with an FP8 KV cache.
* FP8 (weights or KV) below SM 89 and INT weight-only/SmoothQuant on SM 100-119 are refused.
* NCCL and the weight-only groupwise plugin are applied by trtllm-build: shown, never passed.
* Every passed flag and value is one trtllm-build 1.2 accepts (checked by the test double's parser).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugins.recipes import QUANT_RECIPES
from plugins.errors import SpecError
from plugins.targets import registry
from plugins.architectures import ARCHITECTURES
from plugins.resolve import resolve_plugins
from tests.doubles.trtllm_build import parser

GPU_TARGETS = sorted(n for n, t in registry().items() if t.kind == "gpu")
FACTS = json.loads((Path(__file__).resolve().parents[1] / "facts" / "trtllm_1_2_1" / "trtllm_build.json").read_text())
FP8_CTX_SM = tuple(FACTS["fp8_context_fmha_sm"]["cpp_attention_op"]["allowed_sm"])


def _resolve(quant, target, kv=None, tp=1, reuse=False, chunked=False):
    return resolve_plugins(quant=QUANT_RECIPES[quant], kv_cache_quant_algo=kv, dtype="float16", sm=registry()[target].sm,
                           tp_size=tp, world_size=tp, architecture=ARCHITECTURES["LlamaForCausalLM"], tokens_per_block=32,
                           enable_kv_cache_reuse=reuse, enable_chunked_context=chunked)


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("quant", sorted(q for q, r in QUANT_RECIPES.items() if "trtllm" in r.checkpoint_formats))
@pytest.mark.parametrize("kv", [None, "fp8"])
@pytest.mark.parametrize("tp", [1, 2])
def test_plugin_table(quant, target, kv, tp):  # the recipes trtllm-build can see (NVFP4: unified checkpoint only)
    sm = registry()[target].sm
    qa = QUANT_RECIPES[quant].quant_algo
    refused = []
    if qa in ("FP8", "W4A8_AWQ") and sm < 89:
        refused.append("fp8_sm")
    if kv == "fp8" and sm < 89:
        refused.append("fp8_kv_sm")
    if qa in ("W4A16_AWQ", "W8A8_SQ_PER_CHANNEL") and 100 <= sm < 120:
        refused.append("int4_sm100")
    if refused:
        with pytest.raises(SpecError) as e:
            _resolve(quant, target, kv=kv, tp=tp)
        assert set(e.value.codes()) & set(refused), e.value.codes()
        return
    decisions = _resolve(quant, target, kv=kv, tp=tp)
    flags = {d.flag: d for d in decisions}
    assert flags["gemm_plugin"].value == ("disable" if qa == "FP8" else "auto")
    fp8_ctx = qa in ("FP8", "W4A8_AWQ") and sm in FP8_CTX_SM and kv == "fp8"
    assert flags["use_fp8_context_fmha"].value == ("enable" if fp8_ctx else "disable")
    paged = not (kv == "fp8" and not (qa in ("FP8", "W4A8_AWQ") and sm in FP8_CTX_SM))
    assert flags["use_paged_context_fmha"].value == ("enable" if paged else "disable")
    assert ("nccl_plugin" in flags) == (tp > 1) and (tp == 1 or flags["nccl_plugin"].implicit)
    assert ("reduce_fusion" in flags) == (tp > 1)
    if qa in ("W4A16_AWQ", "W4A8_AWQ"):
        assert flags["weight_only_groupwise_quant_matmul_plugin"].implicit
    argv = ["--checkpoint_dir", "x"] + [a for d in decisions for a in d.cli()]
    parser().parse_args(argv)  # exits (SystemExit 2) on any flag or value trtllm-build 1.2 rejects
    assert all(d.cli() == [] for d in decisions if d.implicit)


def test_fp8_refused_below_sm89():
    with pytest.raises(SpecError) as e:
        resolve_plugins(quant=QUANT_RECIPES["fp8"], kv_cache_quant_algo=None, dtype="float16", sm=80, tp_size=1, world_size=1,
                        architecture=ARCHITECTURES["LlamaForCausalLM"], tokens_per_block=32, enable_kv_cache_reuse=False,
                        enable_chunked_context=False)
    assert e.value.codes() == ["fp8_sm"]


@pytest.mark.parametrize("quant", ["int4_awq", "int8_sq"])
def test_int_weight_only_refused_on_blackwell(quant):
    with pytest.raises(SpecError) as e:
        resolve_plugins(quant=QUANT_RECIPES[quant], kv_cache_quant_algo=None, dtype="float16", sm=100, tp_size=1, world_size=1,
                        architecture=ARCHITECTURES["LlamaForCausalLM"], tokens_per_block=32, enable_kv_cache_reuse=False,
                        enable_chunked_context=False)
    assert "int4_sm100" in e.value.codes()


def test_fp8_kv_with_reuse_needs_fp8_context_fmha():
    with pytest.raises(SpecError) as e:
        _resolve("int4_awq", "h100", kv="fp8", reuse=True)
    assert e.value.codes() == ["fp8_kv_paged_context"]
    flags = {d.flag: d.value for d in _resolve("fp8", "h100", kv="fp8", reuse=True)}
    assert flags["use_paged_context_fmha"] == "enable" and flags["use_fp8_context_fmha"] == "enable"


def _trtllm_build(target, **quantization):
    from tests.conftest import REPO_ROOT
    from builders.spec import load_spec

    return load_spec(REPO_ROOT / "configs" / "builds" / "llama-3-8b.yaml", target,
                     overrides={"quantization": quantization} if quantization else None)


@pytest.mark.parametrize("target,quantization", [
    ("h100", {}), ("h100", {"use_fp8_context_fmha": False, "kv_cache_quant_algo": None}),
    ("h100", {"use_fp8_context_fmha": True, "kv_cache_quant_algo": None}),
    ("l40s", {"use_fp8_context_fmha": True}), ("b200", {}), ("a10", {}),
    ("h200", {"use_fp8_context_fmha": False, "kv_cache_quant_algo": "fp8"})])
def test_plan_table_and_trtllm_build_argv_come_from_one_resolution(target, quantization):
    """quantization.use_fp8_context_fmha once changed plan.json and not the argv (the P8 audit's 7a): the
    engine stage builds the argv from the plan's decisions."""
    from builders.engine_trtllm import trtllm_build_argv
    from builders.preflight import make_plan
    from plugins.targets import get_target
    from tests.conftest import hf_config

    build = _trtllm_build(target, **quantization)
    wanted = quantization.get("use_fp8_context_fmha")
    if wanted is not None and wanted != (build.settings.quantization.kv_cache_quant_algo == "fp8"):
        build.settings.serving.enable_kv_cache_reuse = False  # else refused: see the tests below
    plan = make_plan(build, get_target(target), hf_config("llama-3-8b"))
    full = trtllm_build_argv(checkpoint_dir=Path("/c"), output_dir=Path("/o"), limits=plan.limits,
                             plugins=plan.plugins, world_size=build.world_size, gpus_available=8)
    plugin_flags = {"--" + p.flag for p in plan.plugins}
    argv = [a for i, a in enumerate(full) if a in plugin_flags or (i and full[i - 1] in plugin_flags)]
    table = [a for p in plan.plugins if not p.implicit for a in ("--" + p.flag, p.value)]
    assert argv == table
    if wanted is not None:
        assert dict(zip(argv[::2], argv[1::2]))["--use_fp8_context_fmha"] == ("enable" if wanted else "disable")


def test_fp8_context_fmha_on_ada_is_planned_and_passed():
    """The audit's 1e: preflight refused SM 89 although TensorRT-LLM runs FP8 context FMHA there."""
    flags = {d.flag: d.value for d in resolve_plugins(
        quant=QUANT_RECIPES["fp8"], kv_cache_quant_algo=None, dtype="float16", sm=89, tp_size=1, world_size=1,
        architecture=ARCHITECTURES["LlamaForCausalLM"], tokens_per_block=32, enable_kv_cache_reuse=False,
        enable_chunked_context=False, use_fp8_context_fmha=True)}
    # honoured by turning paged context FMHA off (under it trtllm-build would follow the unquantized KV cache)
    assert flags["use_fp8_context_fmha"] == "enable" and flags["use_paged_context_fmha"] == "disable"


@pytest.mark.parametrize("sm", [91, 110, 122])  # SM >= 89 (so not the FP8 gate) without the kernels
def test_fp8_context_fmha_refused_where_attention_op_has_no_kernel(sm):
    with pytest.raises(SpecError) as e:
        resolve_plugins(quant=QUANT_RECIPES["fp8"], kv_cache_quant_algo="fp8", dtype="float16", sm=sm, tp_size=1, world_size=1,
                        architecture=ARCHITECTURES["LlamaForCausalLM"], tokens_per_block=32, enable_kv_cache_reuse=False,
                        enable_chunked_context=False, use_fp8_context_fmha=True)
    assert "fp8_context_fmha_sm" in e.value.codes()


@pytest.mark.parametrize("kv,wanted", [("fp8", False), (None, True)])
def test_fp8_context_fmha_against_the_kv_cache_is_refused_when_serving_needs_paged_context(kv, wanted):
    """trtllm-build sets FP8 context FMHA = FP8 KV cache under paged context FMHA (builder.py build())."""
    with pytest.raises(SpecError) as e:
        _resolve_fp8(kv, wanted, reuse=True)
    assert e.value.codes() == ["fp8_context_fmha_vs_kv_cache"]
    flags = {d.flag: d.value for d in _resolve_fp8(kv, wanted, reuse=False)}
    assert flags["use_paged_context_fmha"] == "disable"
    assert flags["use_fp8_context_fmha"] == ("enable" if wanted else "disable")


def _resolve_fp8(kv, wanted, reuse):
    return resolve_plugins(quant=QUANT_RECIPES["fp8"], kv_cache_quant_algo=kv, dtype="float16", sm=90, tp_size=1, world_size=1,
                           architecture=ARCHITECTURES["LlamaForCausalLM"], tokens_per_block=32, enable_kv_cache_reuse=reuse,
                           enable_chunked_context=False, use_fp8_context_fmha=wanted)


def test_a_weight_only_int8_recipe_gets_the_weight_only_plugin_not_smoothquant():
    """Traits decide, not names: the README's "Extending" example (INT8 weight-only, W8A16) resolves to
    trtllm-build's per-channel weight-only GEMM (builder.py sets weight_only_quant_matmul_plugin for it)."""
    from plugins.recipes import QuantRecipe

    int8_wo = QuantRecipe("int8_wo", "INT8_WEIGHT_ONLY_CFG", "W8A16", 8, needs_calibration_data=False,
                          int_weight_gemm=True, per_channel_scales=True)
    flags = {d.flag: d for d in resolve_plugins(
        quant=int8_wo, kv_cache_quant_algo=None, dtype="float16", sm=90, tp_size=1, world_size=1,
        architecture=ARCHITECTURES["LlamaForCausalLM"], tokens_per_block=32, enable_kv_cache_reuse=False,
        enable_chunked_context=False)}
    assert flags["weight_only_quant_matmul_plugin"].implicit and "smooth_quant_gemm_plugin" not in flags
    sq = {d.flag for d in resolve_plugins(
        quant=QUANT_RECIPES["int8_sq"], kv_cache_quant_algo=None, dtype="float16", sm=90, tp_size=1, world_size=1,
        architecture=None, tokens_per_block=32, enable_kv_cache_reuse=False, enable_chunked_context=False)}
    assert "smooth_quant_gemm_plugin" in sq and "weight_only_quant_matmul_plugin" not in sq
    with pytest.raises(SpecError, match="int4_sm100|SM 100-119"):  # the Blackwell refusal follows the trait
        resolve_plugins(quant=int8_wo, kv_cache_quant_algo=None, dtype="float16", sm=100, tp_size=1, world_size=1,
                        architecture=None, tokens_per_block=32, enable_kv_cache_reuse=False,
                        enable_chunked_context=False)
