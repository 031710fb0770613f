"""Model architectures: the registry of Hugging Face ``architectures[0]`` names the pipeline builds.

Each :class:`Architecture` owns what the rules, the planner and the stages need to know about
one family: the ModelOpt export decoder type, which checkpoint formats ModelOpt exports for it,
which TensorRT-LLM paths load it, its shape traits (q/k/v bias, q/k norm, soft-capping, sliding
windows, mixture of experts), the linear layers of one decoder layer (for the memory plan and
the AWQ group rule) and the attention implementation the portable runtime uses. Rules ask
these traits; adding a family is adding one entry to :data:`ARCHITECTURES` (and, for a new
checkpoint layout, its reader in ``builders/checkpoint.py``). :func:`support` is the one place
that decides whether a runtime and a quantization can build a family, and why not.

Sources (each trait's own source is in its docstring):
- ModelOpt 0.47 ``modelopt/torch/export/model_utils.py`` (``MODEL_NAME_TO_TYPE``: decoder types),
  ``tensorrt_llm_utils.py`` (``convert_to_tensorrt_llm_config``: the TensorRT-LLM checkpoint exporter
  writes only decoder types gpt, gemma, llama, qwen, mpt, recurrentgemma, dbrx, mllama and
  encoder-decoders; others raise "not supported by TensorRT-LLM yet") and ``layer_utils.py``
  (``build_moe_config``/``get_experts_list`` take ``len(module.experts)``: transformers 5's fused
  ``*Experts`` modules are not lists, so MoE exports fail there). Measured with ModelOpt 0.47.0 and
  transformers 5.24 on tiny checkpoints of every family (``tests/builders/test_families.py``).
- TensorRT-LLM 1.2.1 ``tensorrt_llm/models/__init__.py`` (``MODEL_MAP``: the engine path),
  ``tensorrt_llm/_torch/models/*`` (``register_auto_model``: the PyTorch backend / LLM API),
  recorded in ``tests/facts/trtllm_1_2_1/model_families.json``.
- transformers 5.24 ``modeling_rope_utils.py`` (``ROPE_INIT_FUNCTIONS``: the rope types).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from plugins.runtimes import RUNTIMES, Runtime

CheckpointFormat = Literal["trtllm", "hf_unified"]

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
"""``rope_scaling.rope_type`` values the pipeline knows: transformers' ``ROPE_INIT_FUNCTIONS`` keys, which
TensorRT-LLM 1.2.1 also implements (``tensorrt_llm/functional.py`` ``RotaryScalingType``: none, linear,
dynamic, longrope, llama3, yarn, mrope). ``su`` is Phi-3's old name for ``longrope``."""

ROPE_ALIASES = {"su": "longrope", "none": "default"}


@dataclass(frozen=True)
class LinearShard:
    """One linear layer of a decoder layer as a rank holds it: ``n_in x n_out`` after tensor parallelism."""

    name: str
    n_in: int
    n_out: int
    row_parallel: bool
    """Split on its input dim across tp ranks (o_proj, down_proj); column-parallel ones keep their input."""
    count: int = 1
    """How many of it one rank holds (the experts of a MoE layer on this expert-parallel rank)."""


@dataclass(frozen=True)
class MoE:
    """Where a mixture-of-experts family keeps its expert settings in config.json.

    Attributes:
        num_experts_keys: routed experts per MoE layer, the first key config.json has (Mixtral ``num_local_experts``;
            Qwen ``num_experts``, which transformers 5 writes as ``num_local_experts``).
        top_k_key: experts each token is routed to.
        expert_intermediate_key: the intermediate size of one expert (Mixtral reuses ``intermediate_size``).
        shared_expert_key: the intermediate size of the shared expert every token also runs (Qwen2-MoE);
            None when the family has none.
        sparse_step_key: every n-th layer is a MoE layer (Qwen2/3-MoE ``decoder_sparse_step``; others dense
            through ``mlp_only_layers``); None: every layer.
    """

    num_experts_keys: tuple[str, ...]
    top_k_key: str = "num_experts_per_tok"
    expert_intermediate_key: str = "moe_intermediate_size"
    shared_expert_key: Optional[str] = None
    sparse_step_key: Optional[str] = None


@dataclass(frozen=True)
class Architecture:
    """One model family.

    Attributes:
        name: the HF ``config.json`` ``architectures[0]`` value.
        family: the family's display name (docs and messages).
        decoder_type: ModelOpt's decoder type (``model_utils.MODEL_NAME_TO_TYPE``).
        checkpoint_formats: what ModelOpt 0.47 exports for it on transformers 5, in the pipeline's
            preference: ``trtllm`` (``export_tensorrt_llm_checkpoint``, rank shards) and/or ``hf_unified``
            (``export_hf_checkpoint``).
        trtllm_build: TensorRT-LLM 1.2.1's engine path (``MODEL_MAP``) has the family (it still needs the
            ``trtllm`` checkpoint format, which ModelOpt may not export for it).
        llmapi: TensorRT-LLM 1.2.1's PyTorch backend registers it (the ``trtllm-llmapi`` runtime).
        why_no_trtllm: one clause: why the TensorRT engine path cannot build it (empty when it can).
        qkv_bias: q/k/v projections carry a bias (Qwen2).
        qk_norm: per-head RMSNorm on q and k (Qwen3, Gemma 3).
        moe: the expert settings of a mixture-of-experts family (None: dense).
        portable_attention: the attention implementation the portable runtime loads the model with:
            ``sdpa``, or ``eager`` where transformers 5.24 has no SDPA path (Gemma 2's soft-capping).
        reduce_fusion: TensorRT-LLM fuses the all-reduce with the residual add and RMSNorm under tp > 1
            (``tensorrt_llm/commands/build.py``: Llama-family models).
        rope_types: the rope types the family's checkpoints use (a config naming another is refused).
        hf_fused: HF names of fused projections in this family's own checkpoint layout (Phi-3
            ``qkv_proj``, ``gate_up_proj``); informative.
        norms_per_layer: RMSNorm weights of one decoder layer (Gemma 2/3 norm before and after both attention
            and MLP: 4).
        trtllm_keys: TensorRT-LLM checkpoint config.json keys ModelOpt 0.47 leaves out and the engine path
            needs (``qwen_type``: the HF model_type, read with no default by ``tensorrt_llm/models/qwen/model.py``;
            ``attn_bias``: default true there, false for Qwen3). Filled in by ``builders.quantize``.
        tie_default: ``tie_word_embeddings`` when config.json leaves it out (the HF config class's default:
            True for Gemma 2/3).
        global_every: with a ``sliding_window`` and neither ``layer_types`` nor ``sliding_window_pattern`` in
            config.json, every n-th layer attends globally and the others slide, as the HF config class fills in
            ``layer_types`` (transformers 5.24 ``Gemma2Config``: every 2nd, ``Gemma3TextConfig``: every 6th); 0: every
            layer slides (Mistral).
        aiconfigurator: NVIDIA aiconfigurator 0.12's performance model has the architecture
            (``aiconfigurator_core/sdk/common.py`` ``ARCHITECTURE_TO_MODEL_FAMILY``; recorded in
            ``tests/facts/aiconfigurator_0_12_0/info.json``): the plan predicts its speed.
    """

    name: str
    family: str
    decoder_type: str
    checkpoint_formats: tuple[CheckpointFormat, ...]
    trtllm_build: bool
    llmapi: bool
    why_no_trtllm: str = ""
    qkv_bias: bool = False
    qk_norm: bool = False
    moe: Optional[MoE] = None
    portable_attention: Literal["sdpa", "eager"] = "sdpa"
    reduce_fusion: bool = False
    rope_types: tuple[str, ...] = ROPE_TYPES
    hf_fused: tuple[str, ...] = field(default=())
    norms_per_layer: int = 2
    trtllm_keys: tuple[str, ...] = ()
    tie_default: bool = False
    global_every: int = 0
    aiconfigurator: bool = False

    def linear_shards(self, *, hidden_size: int, heads_rank: int, kv_heads_rank: int, head_dim: int,
                      intermediate_rank: int, experts_rank: int = 0, expert_intermediate_rank: int = 0,
                      shared_intermediate_rank: int = 0, num_experts: int = 0) -> list[LinearShard]:
        """The linear layers of one decoder layer on one rank.

        Attention (fused qkv, o_proj), then a dense gated MLP (gate, up, down) when
        ``intermediate_rank`` is set, or for a MoE layer: ``experts_rank`` experts of
        ``expert_intermediate_rank`` (gate, up, down each), the shared expert when
        ``shared_intermediate_rank`` is set, and the router (``hidden x num_experts``, kept 16-bit by
        ModelOpt: its ``quantization_config.ignore`` lists every ``mlp.gate``).
        """
        h = hidden_size
        out = [LinearShard("qkv", h, (heads_rank + 2 * kv_heads_rank) * head_dim, False),
               LinearShard("o_proj", heads_rank * head_dim, h, True)]
        if intermediate_rank:
            out += [LinearShard("gate_proj", h, intermediate_rank, False),
                    LinearShard("up_proj", h, intermediate_rank, False),
                    LinearShard("down_proj", intermediate_rank, h, True)]
        if experts_rank:
            i = expert_intermediate_rank
            out += [LinearShard("expert gate_proj", h, i, False, experts_rank),
                    LinearShard("expert up_proj", h, i, False, experts_rank),
                    LinearShard("expert down_proj", i, h, True, experts_rank)]
        if shared_intermediate_rank:
            i = shared_intermediate_rank
            out += [LinearShard("shared_expert gate_proj", h, i, False),
                    LinearShard("shared_expert up_proj", h, i, False),
                    LinearShard("shared_expert down_proj", i, h, True)]
        return out


_NO_TRTLLM_EXPORT = ("ModelOpt 0.47's TensorRT-LLM checkpoint exporter refuses decoder type {d!r} (tensorrt_llm_utils."
                     "convert_to_tensorrt_llm_config: only gpt, gemma, llama, qwen, mpt, dbrx, mllama)")
_MOE_EXPORT = ("ModelOpt 0.47's TensorRT-LLM checkpoint exporter cannot read transformers 5's fused experts "
               "(layer_utils.build_moe_config takes len(module.experts))")

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("LlamaForCausalLM", "Llama 2/3/3.1/3.2", "llama", ("trtllm", "hf_unified"), trtllm_build=True,
                 llmapi=True, reduce_fusion=True, rope_types=("default", "linear", "dynamic", "yarn", "llama3"), aiconfigurator=True),
    Architecture("MistralForCausalLM", "Mistral", "llama", ("trtllm", "hf_unified"), trtllm_build=True, llmapi=True,
                 reduce_fusion=True, rope_types=("default", "linear", "dynamic", "yarn")),
    Architecture("Qwen2ForCausalLM", "Qwen2/2.5", "qwen", ("trtllm", "hf_unified"), trtllm_build=True, llmapi=True,
                 qkv_bias=True, rope_types=("default", "yarn", "linear", "dynamic"),
                 trtllm_keys=("qwen_type", "attn_bias"), aiconfigurator=True),
    Architecture("Qwen3ForCausalLM", "Qwen3", "qwen", ("trtllm", "hf_unified"), trtllm_build=True, llmapi=True,
                 qk_norm=True, rope_types=("default", "yarn", "linear", "dynamic"),
                 trtllm_keys=("qwen_type", "attn_bias"), aiconfigurator=True),
    Architecture("Gemma2ForCausalLM", "Gemma 2", "gemma2", ("hf_unified",), trtllm_build=True, llmapi=False,
                 why_no_trtllm=_NO_TRTLLM_EXPORT.format(d="gemma2"), portable_attention="eager",
                 rope_types=("default",), tie_default=True, norms_per_layer=4, global_every=2),
    Architecture("Gemma3ForCausalLM", "Gemma 3 (text)", "gemma3", ("hf_unified",), trtllm_build=True, llmapi=True,
                 why_no_trtllm="ModelOpt 0.47 refuses the TensorRT-LLM checkpoint for gemma3 (\"not supported by "
                               "TensorRT-LLM yet\"; it names the PyTorch backend)",
                 qk_norm=True, rope_types=("default", "linear"), tie_default=True, norms_per_layer=4,
                 global_every=6),
    Architecture("Phi3ForCausalLM", "Phi-3/Phi-4", "phi3", ("hf_unified",), trtllm_build=True, llmapi=True,
                 why_no_trtllm=_NO_TRTLLM_EXPORT.format(d="phi3"), rope_types=("default", "longrope"),
                 hf_fused=("qkv_proj", "gate_up_proj")),
    Architecture("MixtralForCausalLM", "Mixtral", "llama", ("hf_unified",), trtllm_build=True, llmapi=True,
                 why_no_trtllm=_MOE_EXPORT, moe=MoE(("num_local_experts",), expert_intermediate_key="intermediate_size"),
                 rope_types=("default",), aiconfigurator=True),
    Architecture("Qwen3MoeForCausalLM", "Qwen3-MoE", "qwen3moe", ("hf_unified",), trtllm_build=True, llmapi=True,
                 why_no_trtllm="ModelOpt 0.47 has no TensorRT-LLM MoE export for qwen3moe (layer_utils.build_moe_config "
                               "asserts the decoder type)",
                 qk_norm=True, moe=MoE(("num_experts", "num_local_experts"), sparse_step_key="decoder_sparse_step"),
                 rope_types=("default", "yarn"), aiconfigurator=True),
    Architecture("Qwen2MoeForCausalLM", "Qwen2-MoE", "qwen", ("hf_unified",), trtllm_build=True, llmapi=True,
                 why_no_trtllm=_MOE_EXPORT, qkv_bias=True,
                 moe=MoE(("num_experts", "num_local_experts"), shared_expert_key="shared_expert_intermediate_size",
                         sparse_step_key="decoder_sparse_step"),
                 rope_types=("default",), aiconfigurator=True),
)}
"""Every architecture the pipeline builds, by HF name."""

DEFAULT_ARCHITECTURE = "LlamaForCausalLM"
"""Assumed when a config.json names no architecture."""

MOE_INT4_REFUSAL = ("ModelOpt 0.47's unified HF export cannot pack INT4 weights of transformers 5 fused experts "
                    "(unified_export_hf.requantize_resmooth_fused_llm_layers: get_experts_list takes len(experts))")


def architecture(name: Optional[str]) -> Optional[Architecture]:
    """The entry for HF architecture ``name`` (None when the pipeline does not support it)."""
    return ARCHITECTURES.get(name or DEFAULT_ARCHITECTURE)


@dataclass(frozen=True)
class Support:
    """Whether a runtime and a quantization build a family: the checkpoint format it would write, or why not."""

    checkpoint_format: Optional[CheckpointFormat]
    reason: str = ""
    """One clause naming the upstream limit; empty when supported."""
    instead: tuple[str, ...] = ()
    """Runtimes that do build this family with this quantization."""

    @property
    def ok(self) -> bool:
        return self.checkpoint_format is not None


def _format_for(arch: Architecture, runtime_formats: tuple[str, ...], quant) -> tuple[Optional[str], str]:
    why = ""
    for fmt in runtime_formats:
        if fmt not in arch.checkpoint_formats:
            continue
        if fmt not in quant.checkpoint_formats:
            why = f"{quant.name} is exported only as {' or '.join(quant.checkpoint_formats)} (ModelOpt 0.47)"
            continue
        if fmt == "hf_unified" and arch.moe is not None and quant.uses_group_size:  # INT4 AWQ/RTN, W4A8 (NVFP4 works)
            why = MOE_INT4_REFUSAL
            continue
        return fmt, ""
    return None, why


def support(arch: Architecture, runtime: Runtime, quant) -> Support:
    """Can ``runtime`` serve ``arch`` quantized with ``quant``
    (a :class:`plugins.recipes.QuantRecipe`)? The one support rule: the docs' family table, the plan and the
    build all ask it.

    A runtime writes the first of its ``checkpoint_formats`` that ModelOpt exports for the family; the
    ``trtllm-build`` engine also needs TensorRT-LLM's engine path to know the family, the LLM API its
    PyTorch backend. When refused, ``instead`` lists the runtimes that do support this family and quantization.
    """
    def one(rt) -> tuple[Optional[str], str]:
        fmt, why = _format_for(arch, rt.checkpoint_formats, quant)
        if fmt is None:
            return None, why or (arch.why_no_trtllm if "trtllm" in rt.checkpoint_formats else
                                 f"no checkpoint format of runtime {rt.name} is exported for {arch.family}")
        if rt.builds_trt_engine and not arch.trtllm_build:
            return None, arch.why_no_trtllm or f"TensorRT-LLM 1.2.1's engine path has no {arch.family} model"
        if rt.llm_api and not arch.llmapi:
            return None, f"TensorRT-LLM 1.2.1's PyTorch backend registers no {arch.name}"
        return fmt, ""

    fmt, why = one(runtime)
    if fmt is not None:
        return Support(fmt)
    instead = tuple(n for n, rt in RUNTIMES.items() if n != runtime.name and one(rt)[0] is not None)
    return Support(None, why, instead)


def support_markdown(quant_names: Optional[list[str]] = None) -> str:
    """The families x runtimes x quantizations table of docs/writing-a-build-file.md, from :func:`support`.

    Each cell lists the quantizations a runtime builds the family with and the checkpoint format it writes;
    refusals point at numbered reasons below the table. Target gates (FP8 needs SM 89+, ...) apply on top.
    """
    from plugins.recipes import QUANT_RECIPES

    quants = quant_names or list(QUANT_RECIPES)
    reasons: list[str] = []

    def note(reason: str) -> str:
        if reason not in reasons:
            reasons.append(reason)
        return f"[{reasons.index(reason) + 1}]"

    head = "| Family | `architectures[0]` | " + " | ".join(f"`{r}`" for r in RUNTIMES) + " |"
    lines = ["Each cell: the `quant_algo` values the runtime builds the family with (`all`: every one) and, in "
             "parentheses, the checkpoint format it writes; or `refused [n]` with the reason numbered below.", "",
             head, "|" + "---|" * (2 + len(RUNTIMES))]
    for arch in ARCHITECTURES.values():
        cells = []
        for rt in RUNTIMES.values():
            verdicts = {q: support(arch, rt, QUANT_RECIPES[q]) for q in quants}
            ok = [q for q, v in verdicts.items() if v.ok]
            refused = {q: v for q, v in verdicts.items() if not v.ok}
            if not ok:
                v = next(iter(refused.values()))
                cells.append(f"refused {note(v.reason)}" + (f"; use {', '.join(v.instead)}" if v.instead else ""))
                continue
            fmt = {verdicts[q].checkpoint_format for q in ok}
            cell = ("all" if not refused else ", ".join(ok)) + f" ({', '.join(sorted(fmt))})"
            for v in {v.reason: v for v in refused.values()}.values():
                cell += f"; {', '.join(q for q, w in refused.items() if w.reason == v.reason)} refused {note(v.reason)}"
            cells.append(cell)
        lines.append(f"| {arch.family} | `{arch.name}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{i}. {r}" for i, r in enumerate(reasons, 1)]
    return "\n".join(lines) + "\n"
