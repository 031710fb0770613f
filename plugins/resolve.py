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

# SM ranges (compute capability x 10)
SM_FP8_MIN = 89             # Ada (8.9) and later have FP8 tensor cores
SM_FP8_CONTEXT_FMHA = 90    # FP8 context FMHA kernels: Hopper
SM_INT4_WO_REFUSED = range(100, 120)  # Blackwell: INT4/INT8 weight-only engines refused by trtllm-build 1.2


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
                    multiple_profiles: bool = True) -> list[PluginDecision]:
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

    Returns:
        decisions in command-line order.
    """
    recipe = QUANT_RECIPES[quant_algo]
    qa = recipe.quant_algo
    fp8_model = qa in ("FP8",)
    world = tp_size * pp_size
    out: list[PluginDecision] = []
    if fp8_model:
        out.append(PluginDecision("gemm_plugin", "disable", "FP8 models use TensorRT's FP8 GEMMs in a strongly "
                                  "typed network; the gemm plugin is left off (TensorRT-LLM FP8 guidance)"))
    else:
        out.append(PluginDecision("gemm_plugin", "auto", f"GEMM plugin in the model dtype ({dtype}) for "
                                  "non-FP8 layers"))
    out.append(PluginDecision("gpt_attention_plugin", "auto", "fused attention plugin: required for in-flight "
                              "batching, paged KV cache and packed (padding-free) inputs"))
    out.append(PluginDecision("remove_input_padding", "enable", "packed inputs: in-flight batching needs it"))
    out.append(PluginDecision("context_fmha", "enable", "fused multi-head attention for the context phase"))
    out.append(PluginDecision("kv_cache_type", "paged", "paged KV cache: blocks allocated on demand, "
                              "needed for in-flight batching"))
    out.append(PluginDecision("tokens_per_block", str(tokens_per_block), "spec: limits.tokens_per_block"))
    paged_ctx = enable_kv_cache_reuse or enable_chunked_context
    why = " and ".join(n for n, on in (("KV-cache reuse", enable_kv_cache_reuse),
                                        ("chunked context", enable_chunked_context)) if on)
    out.append(PluginDecision("use_paged_context_fmha", "enable" if paged_ctx else "disable",
                              f"{why} need(s) paged context FMHA" if paged_ctx else
                              "neither KV-cache reuse nor chunked context is on"))
    fp8_ctx_ok = (qa in ("FP8", "W4A8_AWQ") or kv_cache_quant_algo == "fp8") and sm is not None and \
        sm >= SM_FP8_CONTEXT_FMHA and paged_ctx
    if fp8_ctx_ok:
        out.append(PluginDecision("use_fp8_context_fmha", "enable", f"FP8 model/KV cache on SM {sm} with paged "
                                  "context FMHA: FP8 context attention kernels"))
    if world > 1:
        out.append(PluginDecision("nccl_plugin", "auto", f"world_size {world} > 1: NCCL collectives "
                                  "(trtllm-build enables it itself)", implicit=True))
    if architecture in ("LlamaForCausalLM", "MistralForCausalLM") and tp_size > 1:
        out.append(PluginDecision("reduce_fusion", "enable", f"Llama-family with tp_size {tp_size}: fuse "
                                  "all-reduce with the following RMSNorm"))
    if qa in ("W4A16_AWQ", "W4A16", "W4A16_GPTQ"):
        out.append(PluginDecision("weight_only_groupwise_quant_matmul_plugin", "auto", f"{qa}: group-wise INT4 "
                                  "weight-only GEMM (applied by trtllm-build from the checkpoint's quant_algo)",
                                  implicit=True))
    if fp8_model:
        out.append(PluginDecision("strongly_typed", "enable", "FP8 networks are built strongly typed "
                                  "(trtllm-build sets it from the checkpoint)", implicit=True))
    if multiple_profiles:
        out.append(PluginDecision("multiple_profiles", "enable", "several optimisation profiles: better kernels "
                                  "for both small decode batches and large context batches"))
    return out
