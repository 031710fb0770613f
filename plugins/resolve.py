"""TensorRT-LLM plugin and feature resolution for ``trtllm-build`` (TensorRT-LLM 1.2.x).

:func:`resolve_plugins` turns (quantization, dtype, target, parallelism, limits, serving
options) into a list of :class:`PluginDecision`: the ``trtllm-build`` flag, its value and the
reason, in the order they appear on the command line. The plan prints the list; the
engine builder turns it into flags. Each rule cites the TensorRT-LLM behaviour it follows
(``tensorrt_llm/commands/build.py`` and ``docs/source/legacy/performance/perf-best-practices.md``
of TensorRT-LLM 1.2; the facts relied on are recorded in tests/facts/trtllm_1_2_1/trtllm_build.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from plugins.architectures import Architecture
from plugins.errors import Problem, SpecError
from plugins.recipes import QuantRecipe

# SM ranges (compute capability x 10), TensorRT-LLM 1.x (facts with their commits:
# tests/facts/trtllm_1_2_1/trtllm_build.json):
#   tensorrt_llm/builder.py build(): FP8 context FMHA only for quant_algo FP8/W4A8_AWQ/NVFP4 (off for the rest)
#     and switched off below SM 89; with paged context FMHA it is forced to follow the KV cache: on with an FP8
#     KV cache ("enabled to support FP8 Paged Context FMHA"), off without one; an FP8 KV cache without FP8
#     context FMHA turns paged context FMHA off; INT4/INT8 weight-only, INT8 KV and SmoothQuant raise on SM 100-119.
#   tensorrt_llm/plugin/plugin.py: flag names and value sets (cli_plugin_args, PLUGIN_DTYPE_OPTIONS_MAP).
SM_FP8_MIN = 89             # Ada (8.9) and later have FP8 tensor cores
SM_FP4_MIN = 100            # Blackwell (10.0) and later have FP4 tensor cores (NVFP4)
SM_FP8_CONTEXT_FMHA = (89, 90, 100, 103, 120, 121)
"""SMs whose FP8 context FMHA kernels exist: AttentionOp::initialize refuses mFP8ContextFMHA on any other
(cpp/tensorrt_llm/common/attentionOp.cpp @ eea41b73, the 1.x line; builder.py only checks SM >= 89)."""
SM_INT4_WO_REFUSED = range(100, 120)  # Blackwell: INT4/INT8 weight-only and SmoothQuant engines refused


def fp8_context_fmha_refusal(quant: QuantRecipe, sm: Optional[int]) -> Optional[str]:
    """Why FP8 context FMHA cannot run for ``quant`` on ``sm`` (None: it can; ``sm`` None means a CPU plan,
    where only the quantization is judged)."""
    if not quant.fp8_compute:
        return (f"{quant.quant_algo or 'unquantized'} weights: trtllm-build runs FP8 context FMHA only for FP8 and "
                "W4A8_AWQ checkpoints (builder.py switches it off for the rest)")
    if sm is not None and sm not in SM_FP8_CONTEXT_FMHA:
        return (f"FP8 context FMHA kernels exist for SM {', '.join(map(str, SM_FP8_CONTEXT_FMHA))} "
                f"(attentionOp.cpp); the target is SM {sm}")
    return None


def sm_refusals(quant: QuantRecipe, sm: Optional[int], *, trtllm_build: bool = True) -> list[str]:
    """The codes of the SM gates ``quant`` fails on ``sm`` (None: a CPU plan, nothing is gated), without their
    messages: ``fp8_sm`` (FP8 compute below SM 89), ``nvfp4_sm`` (FP4 below SM 100), ``int4_sm100`` (INT4/INT8
    weight-only and SmoothQuant, which trtllm-build 1.2 refuses on SM 100-119)."""
    if sm is None:
        return []
    codes = []
    if quant.fp8_compute and sm < SM_FP8_MIN:
        codes.append("fp8_sm")
    if quant.fp4_compute and sm < SM_FP4_MIN:
        codes.append("nvfp4_sm")
    if trtllm_build and quant.int_weight_gemm and sm in SM_INT4_WO_REFUSED:
        codes.append("int4_sm100")
    return codes


def recipes_for_sm(sm: Optional[int], *, trtllm_build: bool = True, exclude: tuple[str, ...] = ()) -> list[str]:
    """The quantization recipes (plugins.recipes keys, registry order) that pass every SM gate on ``sm``
    (:func:`sm_refusals`), less ``exclude``: the only recipes a fix for an SM refusal may name."""
    from plugins.recipes import QUANT_RECIPES

    return [n for n, r in QUANT_RECIPES.items()
            if n not in exclude and not sm_refusals(r, sm, trtllm_build=trtllm_build)]


def _quants_fix(sm: int, trtllm_build: bool, current: str, *, or_else: str,
                allowed: Optional[tuple[str, ...]] = None) -> str:
    ok = [q for q in recipes_for_sm(sm, trtllm_build=trtllm_build, exclude=(current,))
          if allowed is None or q in allowed]
    return (f"use quant_algo {' | '.join(ok)} (what SM {sm} runs), or " if ok else "") + or_else


def hardware_problems(quant: QuantRecipe, kv_cache_quant_algo: Optional[str], sm: Optional[int], *,
                      use_fp8_context_fmha: Optional[bool] = None, trtllm_build: bool = True,
                      where: Callable[[str], str] = str, runtimes: tuple[str, ...] = (),
                      quants: Optional[tuple[str, ...]] = None) -> list[Problem]:
    """The SM gates, each rule once, for the rules (builders.preflight) and the resolver. A fix that names
    quantizations names only those that pass these same gates on ``sm`` (:func:`recipes_for_sm`).

    Args:
        quant: the recipe.
        kv_cache_quant_algo: ``fp8`` or None.
        sm: compute capability x 10 (None: a CPU plan, only the quantization is judged).
        use_fp8_context_fmha: the spec's choice; True is checked against the kernels that exist.
        trtllm_build: the engine is built by trtllm-build (its SM 100-119 refusal applies).
        where: maps a dotted spec field to the YAML field that set it (``targets.<t>.`` for an override).
        runtimes: runtimes the target runs that build no trtllm-build engine (plugins.runtimes names): the
            ``int4_sm100`` fix names them (none given: it names none).
        quants: the recipes a fix may name beyond the SM gates (builders.fix_choices.quants: those the runtime
            builds the model's family with); None: any that passes the gates.

    Returns:
        Problems with codes ``fp8_sm``, ``fp8_kv_sm``, ``int4_sm100``, ``nvfp4_sm``, ``fp8_context_fmha_needs_fp8``
        and ``fp8_context_fmha_sm``.
    """
    problems: list[Problem] = []
    if use_fp8_context_fmha and (refusal := fp8_context_fmha_refusal(quant, sm)) is not None:
        problems.append(Problem(where("quantization.use_fp8_context_fmha"), True, refusal,
                                "remove quantization.use_fp8_context_fmha (null lets the resolver decide) or set it "
                                "to false", code="fp8_context_fmha_sm" if quant.fp8_compute
                                else "fp8_context_fmha_needs_fp8"))
    if sm is None:
        return problems
    refused = sm_refusals(quant, sm, trtllm_build=trtllm_build)
    if "fp8_sm" in refused:
        problems.append(Problem(where("quantization.quant_algo"), quant.name,
                                f"{quant.quant_algo} needs FP8 tensor cores (SM >= {SM_FP8_MIN}); the target is SM {sm}",
                                _quants_fix(sm, trtllm_build, quant.name, or_else="an Ada/Hopper/Blackwell target "
                                            "(l4, l40s, h100, h200, b200)", allowed=quants), code="fp8_sm"))
    if kv_cache_quant_algo == "fp8" and sm < SM_FP8_MIN:
        problems.append(Problem(where("quantization.kv_cache_quant_algo"), "fp8",
                                f"an FP8 KV cache needs SM >= {SM_FP8_MIN}; the target is SM {sm}",
                                "set quantization.kv_cache_quant_algo: null, or pick an SM >= 89 target",
                                code="fp8_kv_sm"))
    if "nvfp4_sm" in refused:
        problems.append(Problem(where("quantization.quant_algo"), quant.name,
                                f"{quant.quant_algo} needs FP4 tensor cores (SM >= {SM_FP4_MIN}, Blackwell); the target is "
                                f"SM {sm}", _quants_fix(sm, trtllm_build, quant.name, or_else="a Blackwell target (b200)",
                                                                allowed=quants),
                                code="nvfp4_sm"))
    if "int4_sm100" in refused:
        instead = [r for r in runtimes if r == "trtllm-llmapi"]  # the LLM API's PyTorch backend runs them on SM 100
        problems.append(Problem(where("quantization.quant_algo"), quant.name,
                                f"trtllm-build 1.2 refuses INT4/INT8 weight-only and SmoothQuant engines "
                                f"({quant.quant_algo}) on SM 100-119 (\"not supported on SM>=100\"); the target is "
                                f"SM {sm}", _quants_fix(sm, trtllm_build, quant.name, or_else=(
                                    f"runtime {' | '.join(instead)}" if instead else "a target below SM 100"),
                                    allowed=quants),
                                code="int4_sm100"))
    return problems


@dataclass(frozen=True)
class PluginDecision:
    """One ``trtllm-build`` flag.

    Attributes:
        flag: flag name without dashes (``gemm_plugin``).
        value: the value passed (``auto``, ``disable``, ``enable``, a dtype, or a number as text).
        reason: why, in one sentence.
        implicit: True when trtllm-build applies it by itself (shown in the plan, not passed).
    """

    flag: str
    value: str
    reason: str
    implicit: bool = False

    def cli(self) -> list[str]:
        return [] if self.implicit else [f"--{self.flag}", self.value]


def resolve_plugins(*, quant: QuantRecipe, kv_cache_quant_algo: Optional[str], dtype: str, sm: Optional[int],
                    tp_size: int, world_size: int, architecture: Optional[Architecture], tokens_per_block: int,
                    enable_kv_cache_reuse: bool, enable_chunked_context: bool,
                    use_fp8_context_fmha: Optional[bool] = None, multiple_profiles: bool = True,
                    strict: bool = True) -> list[PluginDecision]:
    """Resolve the plugin/feature flags for one build: the one source of both the plan's plugin table and
    the trtllm-build command line.

    Args:
        quant: the quantization recipe (plugins.recipes).
        kv_cache_quant_algo: ``fp8`` or None.
        dtype: ``float16``/``bfloat16``.
        sm: compute capability x 10 of the target (None for CPU: the list is what a GPU build would use).
        tp_size, world_size: tensor parallelism and tp x pp.
        architecture: the model family (plugins.architectures; None: architecture-specific fusions left out).
        tokens_per_block: paged KV block size.
        enable_kv_cache_reuse, enable_chunked_context: serving options that need paged context FMHA.
        use_fp8_context_fmha: the spec's ``quantization.use_fp8_context_fmha`` (None: decided here). Because
            trtllm-build makes FP8 context FMHA follow the KV cache under paged context FMHA, an explicit
            choice against the KV cache turns paged context FMHA off (or is refused when serving needs it).
        multiple_profiles: build several TensorRT optimisation profiles (faster at varied batch shapes).
        strict: raise SpecError for what trtllm-build 1.2 refuses or silently undoes on this GPU; False
            resolves anyway (the planner shows the table; :mod:`builders.preflight` reports the refusals).

    Returns:
        decisions in command-line order.

    Raises:
        SpecError: the quantization cannot be built on this GPU, or the serving options need a
            feature trtllm-build would silently switch off.
    """
    qa = quant.quant_algo
    if strict and (problems := hardware_problems(quant, kv_cache_quant_algo, sm,
                                                 use_fp8_context_fmha=use_fp8_context_fmha)):
        raise SpecError(problems)
    fp8_model = quant.fp8_compute and quant.weight_bits == 8  # FP8 weights (not W4A8's INT4 weights)
    kv_fp8 = kv_cache_quant_algo == "fp8"
    world = world_size
    out: list[PluginDecision] = []
    if fp8_model:
        out.append(PluginDecision("gemm_plugin", "disable", "FP8 models use TensorRT's FP8 GEMMs in the strongly "
                                  "typed network; the gemm plugin is left off (TensorRT-LLM FP8 guidance)"))
    else:
        out.append(PluginDecision("gemm_plugin", "auto", f"cuBLASLt GEMM plugin in the model dtype ({dtype}) for "
                                  "the unquantized GEMMs"))
    out.append(PluginDecision("gpt_attention_plugin", "auto", "fused attention plugin: required for in-flight "
                              "batching, paged KV cache and packed (padding-free) inputs"))
    out.append(PluginDecision("remove_input_padding", "enable", "packed inputs: in-flight batching needs it"))
    out.append(PluginDecision("context_fmha", "enable", "fused multi-head attention for the context phase"))
    out.append(PluginDecision("kv_cache_type", "paged", "paged KV cache: blocks allocated on demand, "
                              "needed for in-flight batching"))
    out.append(PluginDecision("tokens_per_block", str(tokens_per_block), "spec: limits.tokens_per_block"))

    refusal = fp8_context_fmha_refusal(quant, sm)
    fp8_ctx_possible = refusal is None and sm is not None
    wants_paged_ctx = enable_kv_cache_reuse or enable_chunked_context
    why = " and ".join(n for n, on in (("KV-cache reuse", enable_kv_cache_reuse),
                                        ("chunked context", enable_chunked_context)) if on)
    need = "need" if enable_kv_cache_reuse and enable_chunked_context else "needs"
    # Under paged context FMHA trtllm-build sets FP8 context FMHA = (FP8 KV cache): a spec asking otherwise
    # can only be honoured with paged context FMHA off.
    against_kv = (fp8_ctx_possible and use_fp8_context_fmha is not None and use_fp8_context_fmha != kv_fp8)
    if kv_fp8 and not fp8_ctx_possible:
        # trtllm-build would switch paged context FMHA off itself ("FP8 Paged Context FMHA is disabled").
        if wants_paged_ctx and strict:
            raise SpecError([Problem(
                "quantization.kv_cache_quant_algo", kv_cache_quant_algo,
                f"{why} {need} paged context FMHA, which TensorRT-LLM 1.2 disables with an FP8 KV cache unless "
                f"FP8 context FMHA runs (weights {qa or 'unquantized'} on SM {sm}: it does not)",
                "set kv_cache_quant_algo: null, or use quant_algo fp8 on an FP8-context-FMHA target, or turn off "
                "serving.enable_kv_cache_reuse / enable_chunked_context", code="fp8_kv_paged_context")])
        out.append(PluginDecision("use_paged_context_fmha", "disable", "FP8 KV cache without FP8 context FMHA: "
                                  "trtllm-build cannot use paged context FMHA here"))
        paged_ctx = False
    elif against_kv:
        if wants_paged_ctx and strict:
            raise SpecError([Problem(
                "quantization.use_fp8_context_fmha", use_fp8_context_fmha,
                f"{why} {need} paged context FMHA, under which trtllm-build turns FP8 context FMHA "
                f"{'on' if kv_fp8 else 'off'} to match the {'FP8' if kv_fp8 else 'unquantized'} KV cache "
                "(builder.py build())", "remove quantization.use_fp8_context_fmha (null follows the KV cache), "
                "or change kv_cache_quant_algo", code="fp8_context_fmha_vs_kv_cache")])
        out.append(PluginDecision("use_paged_context_fmha", "disable",
                                  f"spec: quantization.use_fp8_context_fmha = {str(use_fp8_context_fmha).lower()} "
                                  "differs from the KV cache, which paged context FMHA would impose"))
        paged_ctx = False
    else:
        out.append(PluginDecision("use_paged_context_fmha", "enable",
                                  f"{why} {need} paged context FMHA" if wants_paged_ctx else
                                  "TensorRT-LLM 1.x default: lets the server turn on KV-cache reuse and chunked "
                                  "context without a rebuild"))
        paged_ctx = True
    # FP8 context FMHA defaults to on in 1.2 (and is forced for non-FP8 models in 1.2.0: issue #12877):
    # say it explicitly either way.
    on = fp8_ctx_possible and (use_fp8_context_fmha if use_fp8_context_fmha is not None
                               else (kv_fp8 or not paged_ctx))
    if on:
        out.append(PluginDecision("use_fp8_context_fmha", "enable",
                                  "spec: quantization.use_fp8_context_fmha = true" if use_fp8_context_fmha else
                                  f"{qa} weights on SM {sm} with "
                                  f"{'an FP8 KV cache' if kv_fp8 else 'contiguous context FMHA'}: FP8 context "
                                  "attention kernels"))
    else:
        reason = ("spec: quantization.use_fp8_context_fmha = false" if use_fp8_context_fmha is False
                  else refusal if refusal is not None else
                  "no GPU target (CPU plan)" if sm is None else
                  "FP8 paged context FMHA needs an FP8 KV cache (kv_cache_quant_algo: fp8)")
        out.append(PluginDecision("use_fp8_context_fmha", "disable", reason))
    if world > 1:
        out.append(PluginDecision("nccl_plugin", dtype, f"world_size {world} > 1: NCCL collectives "
                                  "(trtllm-build sets it to the model dtype itself)", implicit=True))
    if architecture is not None and architecture.reduce_fusion and tp_size > 1:
        out.append(PluginDecision("reduce_fusion", "enable", f"{architecture.name} with tp_size {tp_size}: fuse "
                                  "all-reduce with the following residual add and RMSNorm"))
    if quant.uses_group_size:
        out.append(PluginDecision("weight_only_groupwise_quant_matmul_plugin", dtype, f"{qa}: group-wise INT4 "
                                  "weight GEMM (applied by trtllm-build from the checkpoint's quant_algo)",
                                  implicit=True))
    elif quant.smoothquant:
        out.append(PluginDecision("smooth_quant_gemm_plugin", dtype, "SmoothQuant: INT8 GEMM and RMSNorm "
                                  "quantization plugins (applied by trtllm-build from the checkpoint)", implicit=True))
    elif quant.int_weight_gemm:
        out.append(PluginDecision("weight_only_quant_matmul_plugin", dtype, f"{qa}: per-channel weight-only INT GEMM "
                                  "(applied by trtllm-build from the checkpoint's quant_algo)", implicit=True))
    out.append(PluginDecision("use_fused_mlp", "enable" if quant.fused_mlp else "disable",
                              "gate+up GEMM fusion: trtllm-build keeps it for unquantized/FP8 models and turns it "
                              "off for other quantizations", implicit=True))
    out.append(PluginDecision("strongly_typed", "enable", "trtllm-build 1.2 always builds strongly typed "
                              "networks (dtypes come from the checkpoint)", implicit=True))
    if multiple_profiles:
        out.append(PluginDecision("multiple_profiles", "enable", "several optimisation profiles: better kernels "
                                  "for both small decode batches and large context batches (longer build only)"))
    return out


HARDWARE_CODES = frozenset({"fp8_sm", "fp8_kv_sm", "int4_sm100", "fp8_context_fmha_needs_fp8", "fp8_context_fmha_sm",
                            "nvfp4_sm"})
"""The codes :func:`hardware_problems` reports (the rules report them with the spec field that set them)."""


MMHA_HEAD_SIZES = (32, 48, 64, 80, 96, 104, 112, 128, 144, 160, 192, 224, 256)
"""Head sizes TensorRT-LLM 1.2.1's masked multi-head attention (the generation kernel) is compiled for
(``cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention.cu``; tests/facts/trtllm_1_2_1/model_families.json)."""


def decode_attention_kernel(head_dim: int, num_heads: int, num_kv_heads: int, beam_width: int) -> Optional[str]:
    """The TensorRT-LLM generation-phase attention kernel that serves this shape, or None when none does.

    XQA (``decoderXQAImplJIT/kernelUtils.cpp``) takes head sizes that are multiples of 16 in [16, 256] for
    grouped-query attention (q heads != kv heads) at beam width 1; otherwise masked MHA needs one of
    :data:`MMHA_HEAD_SIZES`. Context FMHA has no fixed list (it falls back to unfused attention).
    """
    if head_dim % 16 == 0 and 16 <= head_dim <= 256 and num_heads != num_kv_heads and beam_width == 1:
        return "xqa"
    return "mmha" if head_dim in MMHA_HEAD_SIZES else None
