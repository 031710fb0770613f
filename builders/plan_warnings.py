"""The plan's warnings: facts about a build worth knowing that are not errors.

The rules (builders.preflight) refuse a build with a :class:`~plugins.errors.Problem`; these only advise. Each
is one function of :class:`PlanFacts` registered under a stable ``code`` in :data:`PLAN_WARNINGS`, in the order
``Plan.warnings`` lists them; :func:`plan_warnings` runs them all (builders.plan.compute_plan calls it on the
plan it computed). They read the computed plan and what it was computed from, never recompute it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from builders import fix_choices
from builders.spec import ResolvedBuild, ServingConfig
from plugins.architectures import Architecture, architecture, support
from plugins.runtimes import RUNTIMES
from plugins.targets import TargetProfile

HEADROOM_WARN_FRACTION = 0.9
"""The plan warns when weights + activations + reserve take more than this share of a device's memory. Ours, not an
upstream number: the activation figure is an estimate (activation_bytes: +-30%), and TensorRT-LLM sizes the KV pool
from what is left (kv_cache_free_gpu_mem_fraction of the free memory), so under 10% left means a nearly empty pool
or an out-of-memory at load when the estimate is low."""
SPECULATIVE_HELPS_UP_TO = 16
"""Batch size above which the plan asks for speculative_decoding.max_concurrency. Ours, not an upstream number:
TensorRT-LLM's docs/source/features/speculative-decoding.md says the gains are only observable at low batch sizes,
and the published speed-ups (docs/gpu-hosts.md) are measured at batch 1."""


def human_bytes(n: Any) -> str:
    """``n`` bytes as a short string in binary units (KiB, MiB, GiB)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


@dataclass(frozen=True)
class PlanFacts:
    """What a warning reads: the plan as computed and the build, target and config.json it was computed from."""

    plan: Any
    """The builders.plan.Plan computed so far (its memory, KV and performance parts; warnings still empty)."""
    build: ResolvedBuild
    target: TargetProfile
    hf_config: dict

    @property
    def engine(self) -> bool:
        """An engine runtime: the checkpoint stays quantized and sharded over tp x pp GPUs."""
        return self.build.runtime.sharded

    @property
    def arch(self) -> Optional[Architecture]:
        return architecture(self.plan.model.architecture)

    @property
    def act_dtype(self) -> str:
        """The dtype the runtime computes in: the checkpoint's on engine runtimes, the target's otherwise."""
        return self.build.settings.dtype if self.engine else self.target.runtime_dtype

    @property
    def gpus_per_node(self) -> int:
        return self.build.settings.parallelism.gpus_per_node or self.target.gpus_per_node

    @property
    def used_bytes(self) -> int:
        """reserve + weights + draft weights + activations on one rank."""
        m = self.plan.memory
        return m.reserve_bytes + m.weights_bytes_per_rank + m.draft_weights_bytes + m.activation_bytes


@dataclass(frozen=True)
class PlanWarning:
    """One warning: its stable code and the function that words it (None: it does not apply)."""

    code: str
    check: Callable[[PlanFacts], Optional[str]]


PLAN_WARNINGS: list[PlanWarning] = []
"""Every warning, in the order the plan lists them."""


def _warning(code: str):
    def register(check: Callable[[PlanFacts], Optional[str]]):
        PLAN_WARNINGS.append(PlanWarning(code, check))
        return check
    return register


def plan_warnings(facts: PlanFacts) -> list[tuple[str, str]]:
    """(code, text) of every warning that applies to ``facts``, in :data:`PLAN_WARNINGS` order."""
    return [(w.code, text) for w in PLAN_WARNINGS if (text := w.check(facts))]


@_warning("kv_heads_duplicated")
def _kv_heads_duplicated(f: PlanFacts) -> Optional[str]:
    shape, tp = f.plan.model, f.plan.serving_tp
    if f.engine and shape.num_key_value_heads < tp:
        return (f"num_key_value_heads ({shape.num_key_value_heads}) < tp_size ({tp}): each rank holds a "
                f"duplicated KV head, so KV memory per rank is that of 1 head, not "
                f"{shape.num_key_value_heads}/{tp} (counted in the plan)")
    return None


@_warning("vocab_padded")
def _vocab_padded(f: PlanFacts) -> Optional[str]:
    p = f.plan
    if p.vocab_padded != p.model.vocab_size:
        return (f"vocab_size {p.model.vocab_size} padded to {p.vocab_padded} (a multiple of tp_size {p.serving_tp}) "
                "for the lm_head split (counted in the plan)")
    return None


@_warning("portable_parallelism_unused")
def _portable_parallelism_unused(f: PlanFacts) -> Optional[str]:
    par = f.build.settings.parallelism
    if not f.engine and par.world_size > 1:
        return (f"runtime '{f.build.settings.runtime}' serves the merged checkpoint on one device: tp_size/pp_size "
                f"({par.tp_size}/{par.pp_size}) only shape the exported checkpoint"
                + (" (the unified HF export is not sharded: they shape nothing)"
                   if f.plan.checkpoint_format == "hf_unified" else ""))
    return None


@_warning("moe_experts_resident")
def _moe_experts_resident(f: PlanFacts) -> Optional[str]:
    shape, m = f.plan.model, f.plan.memory
    if shape.is_moe:
        return (f"{shape.num_experts} experts per MoE layer ({shape.moe_layers} layers), "
                f"top-{shape.num_experts_per_tok}: all experts stay resident ({human_bytes(m.weights_bytes_per_rank)} "
                f"per rank), a token runs through {m.params_active / 1e9:.2f}B of the {m.params_total / 1e9:.2f}B "
                "parameters")
    return None


@_warning("sliding_window_full_kv")
def _sliding_window_full_kv(f: PlanFacts) -> Optional[str]:
    shape, lim = f.plan.model, f.plan.limits
    if shape.sliding_window and lim.max_seq_len > shape.sliding_window and f.build.runtime.builds_trt_engine:
        return (f"{shape.sliding_layers} layers use a {shape.sliding_window}-token sliding window; the engine's "
                f"KV cache is planned for the whole max_seq_len {lim.max_seq_len} on every layer")
    return None


@_warning("portable_sliding_window")
def _portable_sliding_window(f: PlanFacts) -> Optional[str]:
    """transformers 5.24 continuous batching (the portable runtime) groups layers by config.layer_types and keeps a
    sliding layer's KV in a ring buffer of sliding_window tokens (continuous_batching/cache_allocators/
    sliding_attention.py); with a sliding group it turns its decode fast path off (continuous_api.py:
    max_blocks_per_request = 0). The plan sizes the pool for every layer over every token (KVPlan)."""
    shape, lim = f.plan.model, f.plan.limits
    if f.build.runtime.engine != "pytorch" or not (shape.sliding_window and shape.sliding_layers):
        return None
    longer = lim.max_seq_len > shape.sliding_window
    return (f"{shape.sliding_layers} of {shape.num_hidden_layers} layers use a {shape.sliding_window}-token sliding "
            f"window, and the portable runtime honours it: transformers' continuous batching keeps those layers' KV "
            f"in a {shape.sliding_window}-token ring buffer per sequence and runs without its decode fast path"
            + (f"; the plan counts their KV over the whole max_seq_len {lim.max_seq_len}, so its KV figures are an "
               "upper bound" if longer else f" (max_seq_len {lim.max_seq_len} fits in the window: no token leaves it)"))


@_warning("portable_eager_attention")
def _portable_eager_attention(f: PlanFacts) -> Optional[str]:
    arch = f.arch
    if arch is not None and arch.portable_attention != "sdpa" and not f.engine:
        return (f"{arch.family}: the portable runtime runs {arch.portable_attention} attention (transformers has "
                "no SDPA path for its logit soft-capping): slower than SDPA")
    return None


@_warning("portable_kv_quant_unused")
def _portable_kv_quant_unused(f: PlanFacts) -> Optional[str]:
    q = f.build.settings.quantization
    if not f.engine and q.kv_cache_quant_algo:  # off the engine the KV pool is in act_dtype (KVPlan.dtype_bytes)
        return (f"runtime '{f.build.settings.runtime}' keeps the KV cache in {f.act_dtype}: kv_cache_quant_algo "
                f"{q.kv_cache_quant_algo} only applies in TensorRT-LLM (counted at {f.plan.memory.kv.dtype_bytes} "
                "B/element)")
    return None


@_warning("portable_dequantizes")
def _portable_dequantizes(f: PlanFacts) -> Optional[str]:
    if not f.engine and f.build.recipe.quantized:
        return (f"runtime '{f.build.settings.runtime}' dequantizes weights to {f.act_dtype}: "
                f"{f.build.settings.quantization.quant_algo} changes accuracy and disk size, not serving memory")
    return None


@_warning("tp_crosses_nodes")
def _tp_crosses_nodes(f: PlanFacts) -> Optional[str]:
    tp, gpn = f.plan.serving_tp * f.plan.attention_dp_size, f.gpus_per_node
    if f.engine and tp > gpn:
        return (f"tp_size {tp} > gpus_per_node {gpn}: tensor parallelism crosses nodes (all-reduce over "
                "the network each layer); prefer pp across nodes")
    return None


@_warning("max_num_tokens_clamped")
def _max_num_tokens_clamped(f: PlanFacts) -> Optional[str]:
    lim = f.plan.limits
    if lim.max_num_tokens > lim.max_batch_size * lim.max_seq_len:
        return (f"max_num_tokens {lim.max_num_tokens} > max_batch_size x max_seq_len "
                f"({lim.max_batch_size * lim.max_seq_len}): TensorRT-LLM clamps it to the latter")
    return None


@_warning("kv_bound_workload")
def _kv_bound_workload(f: PlanFacts) -> Optional[str]:
    kv, lim = f.plan.memory.kv, f.plan.limits
    if 0 < kv.workload_sequences < lim.max_batch_size:
        return (f"the KV pool holds {kv.workload_sequences} sequences of {kv.workload_isl}+{kv.workload_osl} tokens, "
                f"fewer than max_batch_size {lim.max_batch_size}: in-flight batches of that shape are KV-bound")
    return None


@_warning("kv_bound_max_seq_len")
def _kv_bound_max_seq_len(f: PlanFacts) -> Optional[str]:
    kv, lim = f.plan.memory.kv, f.plan.limits
    if not 0 < kv.max_seq_len_sequences < lim.max_batch_size:  # none at all is an error (preflight kv_pool_one_seq)
        return None
    sv = f.build.settings.serving
    # each fix is checked for this build and target (builders.fix_choices): a fraction at its bound is not
    # "raised", an FP8 KV cache is named only where the target runs one and the runtime keeps one
    if "max_tokens_in_paged_kv_cache" in kv.pool_source:
        fixes = ["raise serving.max_tokens_in_paged_kv_cache"]
    elif fix_choices.can_raise(ServingConfig, "kv_cache_free_gpu_mem_fraction", sv.kv_cache_free_gpu_mem_fraction):
        fixes = ["raise serving.kv_cache_free_gpu_mem_fraction"]
    else:
        fixes = []
    fp8 = fix_choices.fp8_kv_possible(f.build, f.target)
    if f.engine:
        fixes.append("use an FP8 KV cache (kv_cache_quant_algo: fp8) or more tp/pp ranks" if fp8
                     else "use more tp/pp ranks")
    fixes.append(f"lower limits.max_batch_size to {kv.max_seq_len_sequences} or limits.max_seq_len")
    return (f"the KV pool holds {kv.max_seq_len_sequences} full-length sequences (max_seq_len "
            f"{lim.max_seq_len}), fewer than max_batch_size {lim.max_batch_size}: at most "
            f"{kv.max_seq_len_sequences} requests that run to max_seq_len are in flight at once; fix: "
            + ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1])


@_warning("memory_headroom")
def _memory_headroom(f: PlanFacts) -> Optional[str]:
    m, used = f.plan.memory, f.used_bytes
    free, device = m.free_bytes_after_weights_and_activations, m.device_bytes
    if not (free > 0 and used > HEADROOM_WARN_FRACTION * device):
        return None
    return (f"weights {human_bytes(m.weights_bytes_per_rank + m.draft_weights_bytes)} + activations "
            f"{human_bytes(m.activation_bytes)} + reserve {human_bytes(m.reserve_bytes)} = {human_bytes(used)} take "
            f"{used / device:.0%} of the {human_bytes(device)} of '{f.target.name}' (over "
            f"{HEADROOM_WARN_FRACTION:.0%}): {human_bytes(free)} is left for the KV cache and any estimate error; fix: "
            + _headroom_fixes(f) + "lower limits.max_num_tokens, or pick a target with more memory")


def _headroom_fixes(f: PlanFacts) -> str:
    """What shrinks the weights on an engine runtime, each choice checked (builders.fix_choices): a lighter
    quantization the target runs for this family, more ranks."""
    if not f.engine:
        return ""
    lighter = fix_choices.quants(f.build, f.target, f.arch, lighter=True)
    return (f"quantize (quant_algo {' | '.join(lighter)}), " if lighter else "") + "raise parallelism.tp_size/pp_size, "


@_warning("fp8_available")
def _fp8_available(f: PlanFacts) -> Optional[str]:
    q = f.build.settings.quantization
    if (f.target.kind == "gpu" and f.engine and f.target.fp8 and q.quant_algo == "none"
            and q.kv_cache_quant_algo is None):
        return f"target {f.target.name} has FP8 tensor cores; quant_algo fp8 would halve weight memory"
    return None


@_warning("draft_memory_not_counted")
def _draft_memory_not_counted(f: PlanFacts) -> Optional[str]:
    spec = f.plan.speculative
    if spec is not None and spec.draft_source.startswith("draft memory not counted"):
        return spec.draft_source
    return None


def _drafting(f: PlanFacts) -> int:
    """Requests that draft in one step: max_batch_size, or speculative_decoding.max_concurrency when lower."""
    lim = f.plan.limits
    return min(lim.max_batch_size, f.build.settings.serving.speculative_decoding.max_concurrency
               or lim.max_batch_size)


@_warning("speculative_max_num_tokens")
def _speculative_max_num_tokens(f: PlanFacts) -> Optional[str]:
    spec, lim = f.plan.speculative, f.plan.limits
    if spec is None:
        return None
    drafting = _drafting(f)
    need = drafting * spec.tokens_per_step + (lim.max_batch_size - drafting)  # the rest decode one token
    if lim.max_num_tokens < need:
        return (f"speculative decoding: a generation step takes 1 + max_draft_len = {spec.tokens_per_step} "
                f"tokens per drafting request, so max_num_tokens {lim.max_num_tokens} runs at most "
                f"{lim.max_num_tokens // spec.tokens_per_step} of {drafting} drafting requests a step "
                f"(raise it to {need})")
    return None


@_warning("speculative_high_batch")
def _speculative_high_batch(f: PlanFacts) -> Optional[str]:
    lim = f.plan.limits
    if (f.plan.speculative is not None and lim.max_batch_size > SPECULATIVE_HELPS_UP_TO
            and not f.build.settings.serving.speculative_decoding.max_concurrency):
        return (f"speculative decoding gains show at low batch sizes only (TensorRT-LLM's speculative-"
                f"decoding docs) and max_batch_size is {lim.max_batch_size}: set serving."
                f"speculative_decoding.max_concurrency (e.g. {SPECULATIVE_HELPS_UP_TO}) to stop drafting "
                "when more requests are in flight")
    return None


def _named(f: PlanFacts) -> str:
    return "; ".join(c.entry for c in f.plan.custom_code)


@_warning("remote_code_trusted")
def _remote_code_trusted(f: PlanFacts) -> Optional[str]:
    if not f.build.model.trust_remote_code:
        return None
    if f.plan.custom_code:
        return (f"model.trust_remote_code is true: the checkpoint's own Python code ({_named(f)}) runs, with this "
                "user's rights, wherever transformers loads the checkpoint or its tokenizer: in this build and "
                "in the served models; read it before building")
    return ("model.trust_remote_code is true but the checkpoint names no code of its own (no auto_map in "
            "config.json or tokenizer_config.json): none runs now, but code added to the checkpoint later "
            "would run unchecked; set it false")


@_warning("remote_code_not_run")
def _remote_code_not_run(f: PlanFacts) -> Optional[str]:
    code = f.plan.custom_code
    # (code no class stands in for: builders.preflight refuses)
    if f.build.model.trust_remote_code or not code or not all(c.library_class for c in code):
        return None
    return (f"the checkpoint names Python code of its own ({_named(f)}) that does not run "
            f"(model.trust_remote_code is false): transformers' own "
            f"{', '.join(sorted({c.library_class for c in code}))} load it instead, as for any checkpoint "
            f"of model_type {f.hf_config.get('model_type')!r}; if this one needs its own code, read it and "
            "set model.trust_remote_code: true")


@_warning("engine_path_1_2_only")
def _engine_path_1_2_only(f: PlanFacts) -> Optional[str]:
    arch, mine = f.arch, f.build.runtime.tensorrt_llm
    later = next((r for r in RUNTIMES.values() if r.llm_api and r.tensorrt_llm and r.tensorrt_llm.last_minor is None),
                 None)  # the runtime that follows TensorRT-LLM past the engine path
    if (f.build.runtime.builds_trt_engine and arch is not None and later is not None and mine and mine.last_minor
            and support(arch, later, f.build.recipe).ok):
        return (f"the engine path (runtime {f.build.settings.runtime}) works with TensorRT-LLM "
                f"{'.'.join(map(str, mine.last_minor))}.x only; runtime {later.name} builds this model for "
                f"{later.tensorrt_llm.first_text} and every later release")
    return None


@_warning("lora_slots")
def _lora_slots(f: PlanFacts) -> Optional[str]:
    lora = f.plan.lora
    if lora is None or not f.build.runtime.tensorrt_llm:  # the portable runtime holds every adapter
        return None
    n, out = len(lora.adapters), []
    if n > lora.max_loras:
        out.append(f"one batch runs at most lora.max_loras = {lora.max_loras} of the {n} adapters; requests for "
                   f"the others wait for a GPU slot (each slot {human_bytes(lora.slot_bytes)})")
    if n > lora.max_cpu_loras:
        out.append(f"the host cache holds lora.max_cpu_loras = {lora.max_cpu_loras} of the {n} adapters, so not "
                   "every adapter stays loaded")
    return ("lora: " + "; ".join(out) + f" (raise them to {n})") if out else None


@_warning("prequant_release")
def _prequant_release(f: PlanFacts) -> Optional[str]:
    sq = f.plan.source_quantization
    if sq is None or sq["method"] != "compressed-tensors" or not f.build.runtime.llm_api:
        return None
    # tests/facts/trtllm_1_4/prequantized.json: read by 1.4's _torch/model_config.py; the reader came with PR #10796
    # (January 2026), which the 1.2.1 sources recorded (tests/facts/trtllm_1_2_1/prequantized.json) may predate
    return ("model.source is a compressed-tensors FP8 checkpoint: TensorRT-LLM 1.4's PyTorch backend reads it; "
            "whether 1.2.1 does (its reader came with PR #10796) is not confirmed, so serve it from a 1.4 container "
            "or check it on the GPU host first")
