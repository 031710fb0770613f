"""TensorRT-LLM plugin and feature resolution for ``trtllm-build`` (TensorRT-LLM 1.2.x).

:func:`resolve_plugins` turns (quantization, dtype, target, parallelism, limits, serving
options) into a list of :class:`PluginDecision`: the ``trtllm-build`` flag, its value and the
reason, in the order they appear on the command line. The plan prints the list; the
engine builder turns it into flags. Each rule cites the TensorRT-LLM behaviour it follows
(``tensorrt_llm/commands/build.py`` and ``docs/source/legacy/performance/perf-best-practices.md``
of TensorRT-LLM 1.2; summarised in shared/reference/trtllm.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from builders.quantize import QUANT_RECIPES
from pipeline.errors import Problem, SpecError

# SM ranges (compute capability x 10). Sources (TensorRT-LLM 1.x):
#   tensorrt_llm/builder.py build(): FP8 context FMHA only for quant_algo FP8/W4A8_AWQ/NVFP4 and SM >= 89;
#     with paged context FMHA it also needs an FP8 KV cache, and an FP8 KV cache without FP8 context
#     FMHA turns paged context FMHA off; INT4/INT8 weight-only, INT8 KV and SmoothQuant raise on SM 100-119.
#   cpp/tensorrt_llm/plugins/gptAttentionCommon: "FP8 FMHA cannot be enabled except on Ada or Hopper Arch".
#   tensorrt_llm/plugin/plugin.py: flag names and value sets (cli_plugin_args, PLUGIN_DTYPE_OPTIONS_MAP).
SM_FP8_MIN = 89             # Ada (8.9) and later have FP8 tensor cores
SM_FP8_CONTEXT_FMHA = (89, 90)  # FP8 context FMHA kernels: Ada and Hopper only
SM_INT4_WO_REFUSED = range(100, 120)  # Blackwell: INT4/INT8 weight-only and SmoothQuant engines refused
FP8_CONTEXT_FMHA_ALGOS = ("FP8", "W4A8_AWQ")  # of our recipes; NVFP4 too upstream


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


def resolve_plugins(*, quant_algo: str, kv_cache_quant_algo: Optional[str], dtype: str, sm: Optional[int],
                    tp_size: int, pp_size: int, architecture: str, tokens_per_block: int,
                    enable_kv_cache_reuse: bool, enable_chunked_context: bool,
                    multiple_profiles: bool = True, strict: bool = True) -> list[PluginDecision]:
    """Resolve the plugin/feature flags for one build.

    Args:
        quant_algo: our recipe key (``none``, ``fp8``, ``int4_awq``, ...).
        kv_cache_quant_algo: ``fp8`` or None.
        dtype: ``float16``/``bfloat16``.
        sm: compute capability x 10 of the target (None for CPU: the list is what a GPU build would use).
        tp_size, pp_size: parallelism.
        architecture: checkpoint architecture (``LlamaForCausalLM``...).
        tokens_per_block: paged KV block size.
        enable_kv_cache_reuse, enable_chunked_context: serving options that need paged context FMHA.
        multiple_profiles: build several TensorRT optimisation profiles (faster at varied batch shapes).
        strict: raise SpecError for what trtllm-build 1.2 refuses on this GPU; False resolves anyway
            (the planner shows the table; :mod:`pipeline.preflight` reports the refusals with the rest).

    Returns:
        decisions in command-line order.

    Raises:
        SpecError: the quantization cannot be built on this GPU, or the serving options need a
            feature trtllm-build would silently switch off.
    """
    recipe = QUANT_RECIPES[quant_algo]
    qa = recipe.quant_algo
    if strict:
        _check_hardware(qa, kv_cache_quant_algo, sm)
    fp8_model = qa == "FP8"
    kv_fp8 = kv_cache_quant_algo == "fp8"
    world = tp_size * pp_size
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

    fp8_ctx_possible = qa in FP8_CONTEXT_FMHA_ALGOS and sm in SM_FP8_CONTEXT_FMHA
    wants_paged_ctx = enable_kv_cache_reuse or enable_chunked_context
    why = " and ".join(n for n, on in (("KV-cache reuse", enable_kv_cache_reuse),
                                        ("chunked context", enable_chunked_context)) if on)
    if kv_fp8 and not fp8_ctx_possible:
        # trtllm-build would switch paged context FMHA off itself ("FP8 Paged Context FMHA is disabled").
        if wants_paged_ctx and strict:
            raise SpecError([Problem(
                "quantization.kv_cache_quant_algo", kv_cache_quant_algo,
                f"{why} need(s) paged context FMHA, which TensorRT-LLM 1.2 disables with an FP8 KV cache unless "
                f"FP8 context FMHA runs (weights {qa or 'unquantized'} on SM {sm}: it does not)",
                "set kv_cache_quant_algo: null, or use quant_algo fp8 on an SM 89/90 target, or turn off "
                "serving.enable_kv_cache_reuse / enable_chunked_context", code="fp8_kv_paged_context")])
        out.append(PluginDecision("use_paged_context_fmha", "disable", "FP8 KV cache without FP8 context FMHA: "
                                  "trtllm-build cannot use paged context FMHA here"))
        paged_ctx = False
    else:
        out.append(PluginDecision("use_paged_context_fmha", "enable",
                                  f"{why} need(s) paged context FMHA" if wants_paged_ctx else
                                  "TensorRT-LLM 1.x default: lets the server turn on KV-cache reuse and chunked "
                                  "context without a rebuild"))
        paged_ctx = True
    # FP8 context FMHA defaults to on in 1.2 (and is forced for non-FP8 models in 1.2.0: issue #12877):
    # say it explicitly either way.
    if fp8_ctx_possible and (kv_fp8 or not paged_ctx):
        out.append(PluginDecision("use_fp8_context_fmha", "enable", f"{qa} weights on SM {sm} with "
                                  f"{'an FP8 KV cache' if kv_fp8 else 'contiguous context FMHA'}: FP8 context "
                                  "attention kernels"))
    else:
        reason = (f"{qa or 'unquantized'} weights: FP8 context FMHA needs the FP8 quantization workflow"
                  if qa not in FP8_CONTEXT_FMHA_ALGOS else
                  f"FP8 context FMHA kernels exist only for SM 89/90 (target SM {sm})"
                  if sm not in SM_FP8_CONTEXT_FMHA else
                  "FP8 paged context FMHA needs an FP8 KV cache (kv_cache_quant_algo: fp8)")
        out.append(PluginDecision("use_fp8_context_fmha", "disable", reason))
    if world > 1:
        out.append(PluginDecision("nccl_plugin", dtype, f"world_size {world} > 1: NCCL collectives "
                                  "(trtllm-build sets it to the model dtype itself)", implicit=True))
    if architecture in ("LlamaForCausalLM", "MistralForCausalLM") and tp_size > 1:
        out.append(PluginDecision("reduce_fusion", "enable", f"Llama-family with tp_size {tp_size}: fuse "
                                  "all-reduce with the following residual add and RMSNorm"))
    if qa in ("W4A16_AWQ", "W4A16", "W4A16_GPTQ", "W4A8_AWQ"):
        out.append(PluginDecision("weight_only_groupwise_quant_matmul_plugin", dtype, f"{qa}: group-wise INT4 "
                                  "weight GEMM (applied by trtllm-build from the checkpoint's quant_algo)",
                                  implicit=True))
    if qa == "W8A8_SQ_PER_CHANNEL":
        out.append(PluginDecision("smooth_quant_gemm_plugin", dtype, "SmoothQuant: INT8 GEMM and RMSNorm "
                                  "quantization plugins (applied by trtllm-build from the checkpoint)", implicit=True))
    out.append(PluginDecision("use_fused_mlp", "enable" if qa in (None, "FP8") else "disable",
                              "gate+up GEMM fusion: trtllm-build keeps it for unquantized/FP8 models and turns it "
                              "off for other quantizations", implicit=True))
    out.append(PluginDecision("strongly_typed", "enable", "trtllm-build 1.2 always builds strongly typed "
                              "networks (dtypes come from the checkpoint)", implicit=True))
    if multiple_profiles:
        out.append(PluginDecision("multiple_profiles", "enable", "several optimisation profiles: better kernels "
                                  "for both small decode batches and large context batches (longer build only)"))
    return out


def _check_hardware(qa: Optional[str], kv_cache_quant_algo: Optional[str], sm: Optional[int]) -> None:
    """Refuse what trtllm-build 1.2 refuses on this GPU, before any GPU time is spent."""
    if sm is None:
        return
    problems = []
    if (qa in ("FP8", "W4A8_AWQ") or kv_cache_quant_algo == "fp8") and sm < SM_FP8_MIN:
        problems.append(Problem("quantization.quant_algo", qa, f"FP8 needs SM >= {SM_FP8_MIN} (target SM {sm})",
                                "use int4_awq or none on this GPU, or an Ada/Hopper/Blackwell target",
                                code="fp8_sm"))
    if sm in SM_INT4_WO_REFUSED and qa in ("W4A16_AWQ", "W4A16", "W4A16_GPTQ", "W8A16", "W8A8_SQ_PER_CHANNEL"):
        problems.append(Problem("quantization.quant_algo", qa, f"trtllm-build 1.2 refuses INT4/INT8 weight-only "
                                f"and SmoothQuant engines on SM {sm} (\"not supported on SM>=100\")",
                                "use fp8 on this GPU", code="int_wo_blackwell"))
    if problems:
        raise SpecError(problems)
