"""The pre-flight planner: memory and capability plan of one build on one target.

:func:`compute_plan` is a pure function of the resolved build, the target profile and the
model's Hugging Face ``config.json`` dict (no weights). It returns a :class:`Plan` that
serialises to ``plan.json``: per-rank weight, activation and KV-cache bytes, the KV pool's
capacity in tokens, blocks and sequences, the resolved ``trtllm-build`` plugin set (each with
its reason) and the warnings of builders.plan_warnings. It never raises on a broken rule;
``builders.preflight.make_plan`` runs the rules and raises one :class:`~plugins.errors.SpecError` listing
them all. A build computes its plan once and hands the :class:`Plan` to every stage.

All byte counts are bytes (not KiB/MiB); "per rank" means one GPU of the serving world
(tp_size x pp_size) and, under pipeline parallelism, the heaviest pipeline stage.

Sources: TensorRT-LLM "Memory Usage of TensorRT-LLM"
(https://nvidia.github.io/TensorRT-LLM/reference/memory.html: weights, activations fixed at
build time by the max shapes, KV pool = ``free_gpu_memory_fraction`` of the memory left);
TensorRT-LLM's checkpoint format (``docs/source/architecture/checkpoint.md``: layout, sharding, KV
heads duplicated when fewer than tp).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from builders.admission import AdmissionPlan, admission_plan
from builders.model_shape import ModelShape, _Frozen
from builders.plan_warnings import PlanFacts, plan_warnings
from builders.spec import LimitsConfig, ResolvedBuild
from plugins.architectures import architecture, support
from plugins.errors import Problem, SpecError
from plugins.recipes import recipe
from plugins.resolve import PluginDecision, resolve_plugins
from plugins.runtimes import kv_slots
from plugins.targets import TargetProfile

GIB = 1024 ** 3
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
GPU_RUNTIME_RESERVE_BYTES = 1 * GIB
"""Per-GPU memory the plan sets aside for the CUDA context, cuBLAS/NCCL workspaces and the
runtime's own buffers (an estimate: 0.5-1 GiB is what a CUDA 12 context plus TensorRT-LLM's
workspaces take in practice). CPU targets reserve nothing: memory_gib is already a budget."""


class RuntimeSetting(_Frozen):
    """One setting of the portable runtime's continuous batching, as config.pbtxt will hold it."""

    name: str
    value: str
    reason: str


def portable_runtime_settings(build: ResolvedBuild, capacity_tokens: Optional[int]) -> list[RuntimeSetting]:
    """The portable runtime's continuous-batching settings with their reasons (plan.json runtime_settings):
    the KV slots (plugins.runtimes.kv_slots), the limits it schedules by and the runtime's fixed choices."""
    lim = build.settings.limits
    tokens, kv_reason = kv_slots(lim.max_batch_size, lim.max_seq_len, build.settings.serving.max_tokens_in_paged_kv_cache,
                                 capacity_tokens)
    fixed = [
        ("max_tokens_in_paged_kv_cache", tokens, kv_reason),
        ("tokens_per_block", lim.tokens_per_block, "limits.tokens_per_block: the paged cache's block size"),
        ("max_num_tokens", lim.max_num_tokens, "limits.max_num_tokens: tokens one generation step may schedule "
                                               "(transformers' max_batch_tokens)"),
        ("max_batch_size", lim.max_batch_size, "limits.max_batch_size: requests one step may hold "
                                               "(transformers' max_requests_per_batch)"),
    ]
    return [RuntimeSetting(name=n, value=str(v), reason=r) for n, v, r in (*fixed, *build.runtime.settings)]


class KVPlan(_Frozen):
    """The paged KV cache of one rank."""

    dtype_bytes: int
    """Bytes per KV element: 2 (fp16/bf16), 1 (FP8 KV cache), 4 (portable runtime in float32)."""
    kv_heads_per_rank: int
    """max(1, num_key_value_heads / tp): when kv_heads < tp each rank holds one duplicated head."""
    bytes_per_token: int
    """2 (K and V) x layers/pp x kv_heads_per_rank x head_dim x dtype_bytes."""
    pool_bytes: int
    """Bytes of the KV pool on one rank."""
    pool_source: str
    """What sized the pool: memory fraction, max_tokens_in_paged_kv_cache, or batch x seq (CPU)."""
    tokens_per_block: int
    blocks: int
    """Whole blocks the pool holds."""
    capacity_tokens: int
    """blocks x tokens_per_block."""
    blocks_per_max_seq: int
    """ceil(max_seq_len / tokens_per_block) x max_beam_width."""
    max_seq_len_sequences: int
    """How many max_seq_len sequences fit in the pool at once."""
    workload_isl: int
    workload_osl: int
    workload_sequences: int
    """How many ISL+OSL sequences fit in the pool at once (times attention_dp_size: every rank's pool)."""
    workload_concurrency: int
    """min(sequences, max_batch_size) per rank, times attention_dp_size: in-flight requests of that shape."""


class SpeculativePlan(_Frozen):
    """Speculative decoding as planned (serving.speculative_decoding): what the draft costs on one rank."""

    mode: str
    max_draft_len: int
    tokens_per_step: int
    """1 + max_draft_len: tokens one generation request runs through the target per step."""
    max_concurrency: Optional[int] = None
    """Drafting stops with more requests than this in flight (null: it never stops)."""
    draft_model: Optional[str]
    draft_weights_bytes: int
    """The draft's weights on one rank (:func:`speculative_plan`; 0 for ngram and mtp, whose drafts are text or the
    model's own layers)."""
    draft_kv_bytes_per_token: int
    """KV bytes per token of the draft's layers (they share the paged pool with the target's)."""
    draft_source: str
    """Where the draft's shape came from, or why its memory is not counted."""


def draft_config(build: ResolvedBuild) -> tuple[Optional[dict], str]:
    """The draft's config.json (serving.speculative_decoding: ``draft_hf_config``, else ``draft_model``'s
    folder) and where it came from; (None, why) when neither is readable here."""
    spec = build.settings.serving.speculative_decoding
    if spec is None or spec.mode not in ("eagle3", "draft_target"):
        return None, "no draft checkpoint"
    for path in (spec.draft_hf_config, spec.draft_model and str(Path(spec.draft_model) / "config.json")):
        if path and Path(path).is_file():
            return json.loads(Path(path).read_text()), path
    return None, (f"draft memory not counted: no config.json at {spec.draft_model} (set "
                  "serving.speculative_decoding.draft_hf_config to a copy of the draft's config.json)")


def eagle3_params(cfg: dict) -> int:
    """Parameters of an EAGLE-3 draft head (``LlamaForCausalLMEagle3`` config.json), as the checkpoints hold them.

    Layout of sgl-project/sglang ``python/sglang/srt/models/llama_eagle3.py`` (@03d5a7771f60, after SafeAILab's
    EAGLE ``cnets.py``): ``fc`` fuses three taps of the target's hidden states (3 x target_hidden_size -> hidden);
    the first decoder layer's q/k/v read the embedding and the fused state side by side (2 x hidden inputs) and it
    has three norms (input_layernorm, hidden_norm, post_attention_layernorm); further layers are plain decoder
    layers; a final norm; an lm_head over ``draft_vocab_size`` tokens (the embedding itself is the target's and
    not in the checkpoint; a tied head is the embedding, counted once).
    """
    h = int(cfg["hidden_size"])
    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    hd = int(cfg.get("head_dim") or h // heads)
    q, kv, inter = heads * hd, kv_heads * hd, int(cfg["intermediate_size"])
    layers = int(cfg.get("num_hidden_layers") or 1)
    attn_out_mlp = q * h + 3 * h * inter
    first = 2 * h * (q + 2 * kv) + attn_out_mlp + 3 * h
    rest = (layers - 1) * (h * (q + 2 * kv) + attn_out_mlp + 2 * h)
    head_rows = int(cfg.get("vocab_size") if cfg.get("tie_word_embeddings") else
                    cfg.get("draft_vocab_size") or cfg.get("vocab_size"))
    return first + rest + 3 * int(cfg.get("target_hidden_size") or h) * h + h + head_rows * h


def speculative_plan(build: ResolvedBuild, tp: int, dtype_bytes: int, kv_dtype_bytes: int,
                     draft: Optional[dict], source: str) -> Optional[SpeculativePlan]:
    """The draft's memory on one rank: an EAGLE-3 head by :func:`eagle3_params`, a draft-target model as a whole
    model of its config.json's shape (:func:`_weights`), both at the checkpoint dtype and split by tp; the draft's
    layers add their KV per token to the shared pool."""
    spec = build.settings.serving.speculative_decoding
    if spec is None:
        return None
    weights = kv = 0
    if draft is not None:
        cfg = dict(draft)
        cfg.setdefault("architectures", ["LlamaForCausalLM"])
        shape = ModelShape.from_hf_config(cfg, field="serving.speculative_decoding.draft_model")
        if spec.mode == "eagle3":
            weights = _ceil_div(eagle3_params(cfg), tp) * dtype_bytes
        else:
            per_pp, _, _, _ = _weights(shape, tp, 1, recipe("none"), 128, dtype_bytes, moe_tp=tp, moe_ep=1,
                                       dedupe_tied=True)
            weights = per_pp[0]
        kv = kv_bytes_per_token(shape, tp, 1, kv_dtype_bytes)
    elif spec.mode in ("ngram", "mtp"):
        source = {"ngram": "no draft model (drafts are n-grams of the text)",
                  "mtp": "the model's own MTP layers (in its weights)"}[spec.mode]
    return SpeculativePlan(mode=spec.mode, max_draft_len=spec.max_draft_len, tokens_per_step=1 + spec.max_draft_len,
                           max_concurrency=spec.max_concurrency,
                           draft_model=spec.draft_model, draft_weights_bytes=weights, draft_kv_bytes_per_token=kv,
                           draft_source=source)


class LoraAdapterPlan(_Frozen):
    """One served LoRA adapter (builders.lora.Adapter.summary) and its device bytes on one rank."""

    name: str
    task_id: int
    """Its ``lora_task_id`` (1, 2, ... in the order of ``lora.adapters``)."""
    path: str
    rank: int
    alpha: float
    use_rslora: bool
    scaling: float
    target_modules: list[str]
    layers: int
    parameters: int
    base_model: Optional[str] = None
    bytes_per_rank: int
    """``r x (in + out) x dtype bytes`` over its (layer, module) pairs, split by tp like the base (builders.lora)."""


class LoraPlan(_Frozen):
    """The LoRA adapters and their cache (null in plan.json without ``lora.adapters``)."""

    adapters: list[LoraAdapterPlan]
    max_lora_rank: int
    """``lora.max_lora_rank``, or the largest adapter rank when null."""
    max_loras: int
    max_cpu_loras: int
    target_modules: list[str]
    """The projections any adapter adapts (HF names)."""
    trtllm_modules: list[str]
    """The modules the runtime holds, in TensorRT-LLM's names (trtllm-build ``--lora_target_modules``): the target
    modules, with q, k and v all three when any is a target (upstream adds the missing ones)."""
    slot_bytes: int
    """One cache slot on one rank: an adapter of max_lora_rank on every held module of every layer."""
    gpu_cache_bytes: int
    """max_loras slots, taken from device memory before the KV pool."""
    host_cache_bytes: int
    """max_cpu_loras slots of host memory."""


class MemoryPlan(_Frozen):
    """Device memory of the heaviest rank, in bytes."""

    device_bytes: int
    """The target's memory per device (memory_gib x 2**30)."""
    reserve_bytes: int
    """Set aside for the CUDA context and runtime workspaces (see GPU_RUNTIME_RESERVE_BYTES)."""
    weights_bytes_per_rank: int
    """Weights of the heaviest pipeline stage on one tensor-parallel rank."""
    weights_bytes_by_pp_rank: list[int]
    weights_breakdown: dict[str, int]
    """Bytes of the heaviest rank by part: layers, embedding, lm_head, norms, scales."""
    params_total: int
    """Parameters of the whole model (unsharded; a tied lm_head counted once; every expert)."""
    params_active: int
    """Parameters one token runs through: params_total less the experts it is not routed to (equal for dense)."""
    activation_bytes: int
    """Estimate of the activation memory fixed at build time (formula in activation_bytes())."""
    free_bytes_after_weights_and_activations: int
    kv: KVPlan
    draft_weights_bytes: int = 0
    """The speculative draft's weights on one rank (SpeculativePlan.draft_weights_bytes)."""
    context_logits_bytes: int = 0
    """The runtime's context-logits buffer with limits.gather_context_logits (formula in context_logits_bytes());
    0 without it. TensorRT-LLM allocates it beside the KV pool, in what the pool leaves."""
    lora_cache_bytes: int = 0
    """The LoRA adapters' device cache (LoraPlan.gpu_cache_bytes; 0 without adapters), before the KV pool."""
    total_bytes: int
    """reserve + weights + draft weights + activations + context logits + LoRA cache + KV pool on one rank."""


class PredictedPoint(_Frozen):
    """The prediction at one concurrency (aggregated in-flight batching, steady state): aiconfigurator's, or the
    roofline estimate's (PerformancePrediction.method)."""

    concurrency: int
    """Requests in flight (aiconfigurator's batch_size)."""
    ttft_ms: float
    tpot_ms: float
    request_latency_ms: float
    """TTFT + (osl - 1) x TPOT."""
    output_tokens_per_s: float
    """All GPUs of the instance (tp x pp)."""
    output_tokens_per_s_per_gpu: float
    output_tokens_per_s_per_user: float
    kv_cache_warning: Optional[str] = None
    """aiconfigurator's own KV-capacity check, where it disagrees with this plan's KV pool."""
    output_tokens_per_s_calibrated: Optional[float] = None
    """output_tokens_per_s corrected by builders/perf_calibration.py (fitted to TensorRT-LLM's published
    throughput); None where the correction does not apply (PerformancePrediction.calibration says why)."""
    output_tokens_per_s_per_gpu_calibrated: Optional[float] = None
    """The same per GPU (tp x pp)."""


class BackendPrediction(_Frozen):
    """One serving framework's predictions from its database in aiconfigurator."""

    backend: str
    """trtllm, vllm or sglang."""
    version: Optional[str] = None
    """The framework release the database was measured with (not necessarily the one deployed)."""
    database_mode: Optional[str] = None
    """SILICON: every operation from measured kernel tables (or modeled from measured parts); HYBRID: a table
    lacked the shape and empirical / speed-of-light formulas filled in."""
    measured_share: Optional[float] = None
    """Share of predicted latency from measured tables (aiconfigurator's source tags silicon and estimated), 0-1;
    the rest from formulas. The lowest over the points."""
    points: list[PredictedPoint] = []
    error: Optional[str] = None
    """Why there is no prediction for this framework (its database lacks a kernel, out of memory, ...)."""


class PerformancePrediction(_Frozen):
    """Predicted speed of the build on its target: NVIDIA aiconfigurator's measured-kernel performance model
    (builders/perf_model.py) or, on a target it has no database for, a first-principles roofline estimate
    (builders/roofline.py); never a measurement of this build."""

    available: bool
    method: str = "aiconfigurator"
    """``aiconfigurator``, or ``roofline``: the first-principles estimate (builders/roofline.py), whose error against
    aiconfigurator is ``stated_error``."""
    reason: str = ""
    """Why there are no predictions (a missing library, a target or family it cannot model); with the roofline
    estimate, why aiconfigurator did not answer."""
    source: str = ""
    """The library and version that predicted, or the estimate's label."""
    stated_error: str = ""
    """The roofline estimate's error against aiconfigurator where both answer (docs/benchmarks/prediction.md)."""
    system: Optional[str] = None
    isl: int = 0
    osl: int = 0
    inputs: dict[str, Any] = {}
    """What was passed for every point besides the concurrency (quant modes, parallel sizes, ctx_tokens)."""
    backends: list[BackendPrediction] = []
    elapsed_s: float = 0.0
    cached: bool = False
    calibration: str = ""
    """builders/perf_calibration.py on the trtllm points: the factor, its source and stated error, or why it does
    not apply ("" for the roofline estimate and without predictions)."""
    calibration_factor: Optional[float] = None
    """The multiplier calibrated / aiconfigurator output tokens/s (dimensionless); None where not applied."""


class CustomCode(_Frozen):
    """One ``auto_map`` entry of the checkpoint (builders.model_fetch.code_stand_ins)."""

    entry: str
    """``<file>: <auto class> -> <module.Class>``."""
    library_class: Optional[str]
    """transformers' own class that loads this part while model.trust_remote_code is false; null: none (the
    checkpoint cannot be loaded without running its code)."""


class Plan(_Frozen):
    """What a build will be, on which hardware, with which memory: the content of plan.json."""

    build: str
    target: str
    runtime: str
    tensorrt_llm_versions: str = ""
    """The TensorRT-LLM releases this build's path works with (plugins.runtimes.Runtime.tensorrt_llm_versions)."""
    dtype: str
    quant_algo: str
    trtllm_quant_algo: Optional[str]
    """TensorRT-LLM's QuantAlgo of the weights: the recipe's, or a pre-quantized source's own (AutoAWQ and AutoGPTQ
    are W4A16_GPTQ: INT4 with zero points)."""
    kv_cache_quant_algo: Optional[str]
    tp_size: int
    pp_size: int
    world_size: int
    serving_tp: int
    """Tensor parallelism of attention and dense layers as served (1 for the portable pytorch runtime and with
    attention DP)."""
    attention_dp_size: int = 1
    """Ranks that each serve their own requests with their own KV pool (parallelism.enable_attention_dp: tp_size;
    else 1); ``memory.kv`` is one rank's pool, its workload figures count every rank's sequences."""
    serving_pp: int
    gpus_available: int
    """gpus_per_node x num_nodes (1 on CPU targets)."""
    target_sm: Optional[int]
    target_memory_gib: float
    model: ModelShape
    checkpoint_format: Optional[str] = None
    """What the checkpoint stage writes for this family and runtime (plugins.architectures.support): ``trtllm`` rank
    shards or the ``hf_unified`` export; null when the runtime cannot build the family (the rules say why)."""
    moe_tp_size: int = 1
    moe_ep_size: int = 1
    """Expert tensor / expert parallelism the plan shards MoE layers with (1, 1 for dense models)."""
    vocab_padded: int
    """vocab_size rounded up to a multiple of serving_tp (lm_head rows)."""
    limits: LimitsConfig
    """The build limits, the spec's typed object: engine.json, config.pbtxt and trtllm-build take them from here."""
    memory: MemoryPlan
    plugins: list[PluginDecision]
    """The trtllm-build decisions (plugins.resolve), each with its reason; the engine stage passes them."""
    speculative: Optional[SpeculativePlan] = None
    """Speculative decoding and its draft's memory (null: off)."""
    runtime_settings: list[RuntimeSetting] = []
    """The pytorch runtime's continuous-batching settings and why (empty for the TensorRT-LLM runtimes)."""
    lora: Optional[LoraPlan] = None
    """LoRA adapters served beside the base model (null: none)."""
    source_quantization: Optional[dict] = None
    """The quantization model.source already carries (builders.prequant.Prequantized.record): the quantize stage does
    not run and quant_algo is the checkpoint's; null: an unquantized source that the build quantizes."""
    admission: Optional[AdmissionPlan] = None
    """Requests held at once before more are refused as overloaded: in flight + queued (builders.admission)."""
    plugins_apply: bool
    """True when the runtime builds a TensorRT engine (trtllm); otherwise the list is informative."""
    warnings: list[str]
    performance: Optional[PerformancePrediction] = None
    """Predicted TTFT, TPOT and throughput (``trtpipe plan``, runtimes trtllm and trtllm-llmapi on GPU targets)."""
    trust_remote_code: bool = False
    """The spec's ``model.trust_remote_code``: whether transformers may run the checkpoint's own code, at every
    load in the build and in the served models."""
    custom_code: list[CustomCode] = []
    """The checkpoint's own code, as its ``auto_map`` entries name it (:func:`source_code`); empty: none."""

    def to_json(self) -> dict:
        return self.model_dump(mode="json")

    def write(self, path: Path) -> Path:
        """Write plan.json atomically to ``path``."""
        from plugins.fsutil import write_json

        write_json(Path(path), self.to_json())
        return Path(path)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def activation_bytes(shape: ModelShape, tp: int, vocab_rank: int, max_num_tokens: int, max_batch_size: int,
                     max_beam_width: int, act_bytes: int) -> int:
    """Estimate of the activation memory of one rank, in bytes.

    TensorRT sizes activations at build time for the largest profile shape and reuses memory
    between layers, so the peak is that of one decoder layer at ``max_num_tokens`` packed
    tokens, plus the logits buffer (TensorRT-LLM docs, "Memory Usage of TensorRT-LLM",
    section "Activation size": activations are pre-computed from the max shapes; TP reduces
    them, PP does not). Formula::

        max_num_tokens x act_bytes x (2 x hidden                  # residual + normed input
                                      + (q + 2 kv) heads/tp x head_dim   # fused QKV output
                                      + q heads/tp x head_dim     # attention output
                                      + 3 x intermediate/tp)      # gate, up and their product
        + max_batch_size x max_beam_width x vocab/tp x 4          # FP32 logits of the last tokens

    It is an estimate (±30%: kernels' workspaces vary); the plan reserves
    GPU_RUNTIME_RESERVE_BYTES on top.
    """
    q_rank = _ceil_div(shape.num_attention_heads, tp)
    kv_rank = max(1, _ceil_div(shape.num_key_value_heads, tp))
    inter_rank = _ceil_div(shape.intermediate_size, tp)
    width = 2 * shape.hidden_size + (q_rank + 2 * kv_rank) * shape.head_dim + q_rank * shape.head_dim \
        + 3 * inter_rank
    return max_num_tokens * act_bytes * width + max_batch_size * max_beam_width * vocab_rank * 4


LOGITS_DTYPE_BYTES = 4
"""Bytes per logit of an engine built with gather_context_logits: float32, which the engine stage asks for
(``--logits_dtype float32``) because the repository declares context_logits TYPE_FP32 and the C++ backend fails a
response whose logits dtype differs (tests/facts/trtllm_1_2_1/log_probs.json ``logits_datatype``)."""


def context_logits_bytes(vocab_size: int, world_size: int, max_num_tokens: int) -> int:
    """The context-logits buffer of one rank of an engine built with gather_context_logits, in bytes::

        max_num_tokens x vocab_size padded to a multiple of world_size x 4        # float32 logits

    Source: TensorRT-LLM ``cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp`` (commit 2a9abd95,
    ``RuntimeBuffers::reshape``): when the engine computes context logits, each step with context requests
    reallocates the logits buffer as [numContextTokens + numGenSequences, vocabSizePadded] in the engine's logits
    dtype, on every rank of the last pipeline stage; those tokens are one forward pass, at most max_num_tokens;
    ``ModelConfig::getVocabSizePadded(worldSize)`` rounds the vocabulary up to a multiple of tp x pp (every rank
    holds the whole gathered vocabulary). Without it the buffer is [max_batch_size x max_beam_width, vocab], in
    activation_bytes(). The buffer is allocated at the first such step, after the KV pool was sized
    (``TrtGptModelInflightBatching``'s constructor creates the runtime buffers, then the KV cache manager from the
    free memory): it must fit in what the pool leaves (builders.preflight.memory_problems).
    """
    return max_num_tokens * _ceil_div(vocab_size, world_size) * world_size * LOGITS_DTYPE_BYTES


def kv_bytes_per_token(shape: ModelShape, tp: int, pp: int, dtype_bytes: int) -> int:
    """KV bytes per token per rank = 2 x (layers/pp) x max(1, kv_heads/tp) x head_dim x dtype_bytes.

    K and V (the 2) for each of the rank's layers; when kv_heads < tp, TensorRT-LLM duplicates
    KV heads so each rank holds one (TensorRT-LLM docs "Memory Usage of TensorRT-LLM", KV cache; checkpoint
    format, GQA).
    Llama-3-8B: 2 x 32 x 8 x 128 x 2 = 131072 B (128 KiB) per token in BF16.
    """
    layers_rank = _ceil_div(shape.num_hidden_layers, pp)
    kv_rank = max(1, _ceil_div(shape.num_key_value_heads, tp))
    return 2 * layers_rank * kv_rank * shape.head_dim * dtype_bytes


def layer_shards(shape: ModelShape, tp: int, moe_tp: int, moe_ep: int, *, moe_layer: bool) -> list:
    """The linear shards of one decoder layer on one rank (plugins.architectures.Architecture.linear_shards).

    Attention and dense MLPs split over tp; a MoE layer's experts split into moe_ep groups, each expert's
    intermediate dim over moe_tp (TensorRT-LLM ``tensorrt_llm/mapping.py``: moe_tp x moe_ep = tp); the shared
    expert splits over tp like a dense MLP.
    """
    arch = architecture(shape.architecture) or architecture(None)
    kw = dict(hidden_size=shape.hidden_size, heads_rank=_ceil_div(shape.num_attention_heads, tp),
              kv_heads_rank=max(1, _ceil_div(shape.num_key_value_heads, tp)), head_dim=shape.head_dim)
    if not moe_layer:
        return arch.linear_shards(**kw, intermediate_rank=_ceil_div(shape.intermediate_size, tp))
    return arch.linear_shards(**kw, intermediate_rank=0, experts_rank=_ceil_div(shape.num_experts, moe_ep),
                              expert_intermediate_rank=_ceil_div(shape.moe_intermediate_size, moe_tp),
                              shared_intermediate_rank=_ceil_div(shape.shared_expert_intermediate_size, tp),
                              num_experts=shape.num_experts)


def _router_params(shape: ModelShape) -> int:
    """Parameters of a MoE layer's router (hidden x num_experts) and shared-expert gate (hidden x 1), both
    left 16-bit by ModelOpt (``quantization_config.ignore`` lists every ``mlp.gate``)."""
    return shape.hidden_size * (shape.num_experts + (1 if shape.shared_expert_intermediate_size else 0))


def _weights(shape: ModelShape, tp: int, pp: int, quant, group_size: int, dtype_bytes: int,
             dedupe_tied: bool, moe_tp: int = 1, moe_ep: int = 1) -> tuple[list[int], dict[str, int], int, int]:
    """Per-PP-rank weight bytes (heaviest TP rank), the heaviest rank's breakdown, total and active params.

    ``quant``: what gives a linear layer's bytes (``linear_bytes``): a plugins.recipes.QuantRecipe, or the
    builders.prequant.Prequantized of a pre-quantized source.

    Active parameters per token count the attention, the router, the shared expert and top-k experts of
    each MoE layer (all experts stay resident: the bytes count them all).
    """
    h = shape.hidden_size
    arch = architecture(shape.architecture) or architecture(None)
    kinds = [shape.is_moe and i < shape.moe_layers for i in range(shape.num_hidden_layers)]
    # Which layers are MoE only matters by count here: pipeline stages take equal layer counts and the
    # heaviest stage is planned with MoE layers first.
    per_kind = {}
    for moe_layer in set(kinds):
        w = sc = 0
        for shard in layer_shards(shape, tp, moe_tp, moe_ep, moe_layer=moe_layer):
            lw, ls = quant.linear_bytes(shard.n_in, shard.n_out, group_size, dtype_bytes)
            w, sc = w + shard.count * lw, sc + shard.count * ls
        router = _router_params(shape) * dtype_bytes if moe_layer else 0
        norms = arch.norms_per_layer * h * dtype_bytes
        qk = 2 * shape.head_dim * dtype_bytes if arch.qk_norm else 0  # q_norm, k_norm: one head_dim vector each
        bias = ((_ceil_div(shape.num_attention_heads, tp) + 2 * max(1, _ceil_div(shape.num_key_value_heads, tp)))
                * shape.head_dim * dtype_bytes) if arch.qkv_bias else 0
        per_kind[moe_layer] = {"layers": w + bias, "router": router, "scales": sc, "norms": norms + qk}
    vocab_padded = _ceil_div(shape.vocab_size, tp) * tp
    # ModelOpt's TensorRT-LLM export shards the embedding over tp (use_parallel_embedding, sharding dim 0);
    # the unified HF checkpoint and the portable runtime hold it whole (tp is 1 for them here).
    embedding = (vocab_padded // tp) * h * dtype_bytes      # first PP rank
    lm_head = (vocab_padded // tp) * h * dtype_bytes       # split on dim 0, last PP rank, 16-bit
    if dedupe_tied and shape.tie_word_embeddings:
        lm_head = 0                                         # HF checkpoint: one shared tensor
    layers_rank = _ceil_div(shape.num_hidden_layers, pp)
    per_rank, breakdowns = [], []
    for r in range(pp):
        stage = sorted(kinds, reverse=True)[r * layers_rank:(r + 1) * layers_rank] if pp > 1 else kinds
        parts = {"layers": 0, "router": 0, "scales": 0, "norms": h * dtype_bytes if r == pp - 1 else 0,
                 "embedding": embedding if r == 0 else 0, "lm_head": lm_head if r == pp - 1 else 0}
        for kind in stage:
            for k, v in per_kind[kind].items():
                parts[k] += v
        if not shape.is_moe:
            parts.pop("router")
        per_rank.append(sum(parts.values()))
        breakdowns.append(parts)
    heaviest = max(range(pp), key=lambda r: per_rank[r])

    def layer_params(moe_layer: bool, active: bool) -> int:
        n = 0
        for sh in layer_shards(shape, 1, 1, 1, moe_layer=moe_layer):
            count = min(sh.count, shape.num_experts_per_tok) if (active and sh.count > 1) else sh.count
            n += count * sh.n_in * sh.n_out
        return n + arch.norms_per_layer * h + (_router_params(shape) if moe_layer else 0)

    head = h + shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    params = sum(layer_params(k, False) for k in kinds) + head
    active = sum(layer_params(k, True) for k in kinds) + head
    return per_rank, breakdowns[heaviest], params, active


def plugin_decisions(build: ResolvedBuild, sm: Optional[int], architecture_name: Optional[str] = None, *,
                     strict: bool = False) -> list[PluginDecision]:
    """The trtllm-build plugin decisions for ``build`` on a GPU of ``sm`` (plugins.resolve.resolve_plugins).

    The one place the resolver's arguments are taken from the spec. ``architecture_name`` is the model's
    HF architecture (None before the model is read: architecture-specific fusions are left out).
    """
    s = build.settings
    q, sv = s.quantization, s.serving
    return resolve_plugins(
        quant=build.recipe, kv_cache_quant_algo=q.kv_cache_quant_algo, dtype=s.dtype, sm=sm,
        tp_size=s.parallelism.tp_size, world_size=build.world_size,
        architecture=architecture(architecture_name) if architecture_name else None,
        tokens_per_block=s.limits.tokens_per_block, enable_kv_cache_reuse=sv.enable_kv_cache_reuse,
        enable_chunked_context=sv.enable_chunked_context, use_fp8_context_fmha=q.use_fp8_context_fmha,
        strict=strict)


def lora_plan(build: ResolvedBuild, shape: ModelShape, adapters: list, dtype_bytes: int, tp: int) -> Optional[LoraPlan]:
    """The adapters' bytes and cache slots (builders.lora: adapter_bytes, slot_bytes); None without adapters."""
    from builders.lora import HF_TO_TRTLLM, adapter_bytes, max_rank, slot_bytes

    if not build.settings.lora.adapters or not adapters:
        return None
    lo = build.settings.lora
    modules = sorted({m for a in adapters for m in a.target_modules})
    # TensorRT-LLM holds q, k and v together when any is adapted (its get_missing_qkv_modules, on the engine and the
    # LLM-API paths), and sizes its cache over every module it holds.
    qkv = {"q_proj", "k_proj", "v_proj"}
    completed = sorted(set(modules) | (qkv if qkv & set(modules) else set()))
    trtllm = bool(build.runtime.tensorrt_llm)
    if trtllm:
        slot = slot_bytes(shape, tuple(completed), max_rank(lo, adapters), dtype_bytes, tp)
    else:  # the portable runtime stacks every adapter per adapted layer, padded to the largest adapter rank
        slot = slot_bytes(shape, tuple(modules), max(a.rank for a in adapters), dtype_bytes, tp)
    return LoraPlan(adapters=[LoraAdapterPlan(**a.summary(), bytes_per_rank=adapter_bytes(a, dtype_bytes, tp))
                              for a in adapters],
                    max_lora_rank=max_rank(lo, adapters), max_loras=lo.max_loras, max_cpu_loras=lo.max_cpu_loras,
                    target_modules=modules, trtllm_modules=[HF_TO_TRTLLM[m] for m in completed], slot_bytes=slot,
                    gpu_cache_bytes=slot * (lo.max_loras if trtllm else len(adapters)),
                    host_cache_bytes=slot * lo.max_cpu_loras if trtllm else 0)


def compute_plan(build: ResolvedBuild, target: TargetProfile, hf_config: dict, *, isl: int = 128,
                 osl: int = 128, draft: Optional[dict] = None, draft_source: str = "",
                 adapters: Optional[list] = None, source_quantization=None) -> Plan:
    """Plan ``build`` on ``target`` for the model described by ``hf_config`` (pure; no rule raises).

    Args:
        build: the resolved spec for one target.
        target: the hardware profile.
        hf_config: the model's HF ``config.json`` as a dict (no weights needed).
        isl, osl: input and output sequence length of the workload whose concurrency the plan
            reports (tokens).
        draft, draft_source: the speculative draft's config.json and where it came from (:func:`draft_config`).
        adapters: the LoRA adapters of ``lora.adapters`` (builders.lora.read_adapters; None: none counted).
        source_quantization: a pre-quantized source's builders.prequant.Prequantized (None: read from
            ``hf_config``'s quantization_config, builders.prequant.detect).

    Returns:
        The plan. Rules are checked by :func:`builders.preflight.make_plan`, which calls this.
    """
    s = build.settings
    q, par, lim, sv = s.quantization, s.parallelism, s.limits, s.serving
    shape = ModelShape.from_hf_config(hf_config)
    engine = build.runtime.sharded  # keeps the checkpoint quantized and sharded over tp x pp GPUs
    tp, pp = (par.tp_size, par.pp_size) if engine else (1, 1)
    # attention DP (engine runtimes): attention, dense layers and the LM head whole on every rank, experts split
    tp, dp = (par.attention_tp, par.attention_dp_size) if engine else (tp, 1)

    # dtypes: engine runtimes keep the checkpoint dtype and quantization; the portable runtime
    # dequantizes into the target's runtime_dtype (float32 on CPU).
    act_dtype = s.dtype if engine else target.runtime_dtype
    dtype_bytes = DTYPE_BYTES[act_dtype]
    kv_dtype_bytes = 1 if (engine and q.kv_cache_quant_algo == "fp8") else dtype_bytes
    arch = architecture(shape.architecture)
    fmt = support(arch, build.runtime, build.recipe).checkpoint_format if arch else None
    moe_tp, moe_ep = par.moe_sizes if engine else (1, 1)
    pq = source_quantization or prequant_of(hf_config)  # a pre-quantized source: its own layout
    per_pp, breakdown, params, active = _weights(shape, tp, pp, (pq or build.recipe) if engine else recipe("none"),
                                                 q.group_size, dtype_bytes, moe_tp=moe_tp, moe_ep=moe_ep,
                                                 dedupe_tied=not engine or fmt != "trtllm")
    weights = max(per_pp)
    vocab_padded = _ceil_div(shape.vocab_size, tp) * tp
    acts = activation_bytes(shape, tp, vocab_padded // tp, lim.max_num_tokens, lim.max_batch_size,
                            lim.max_beam_width, dtype_bytes)
    device = int(target.memory_gib * GIB)
    reserve = GPU_RUNTIME_RESERVE_BYTES if target.kind == "gpu" else 0
    spec = speculative_plan(build, tp, DTYPE_BYTES[s.dtype], kv_dtype_bytes, draft, draft_source)
    draft_weights = spec.draft_weights_bytes if spec else 0
    lora = lora_plan(build, shape, adapters or [], dtype_bytes, tp)
    lora_cache = lora.gpu_cache_bytes if lora else 0
    free = device - reserve - weights - draft_weights - acts - lora_cache

    bpt = kv_bytes_per_token(shape, tp, pp, kv_dtype_bytes) + (spec.draft_kv_bytes_per_token if spec else 0)
    cap = sv.max_tokens_in_paged_kv_cache
    if target.kind == "cpu":  # CPU targets allocate per sequence
        tokens, source = kv_slots(lim.max_batch_size, lim.max_seq_len, cap)
        pool = tokens * bpt
    else:
        pool = int(max(0, free) * sv.kv_cache_free_gpu_mem_fraction)
        source = "serving.kv_cache_free_gpu_mem_fraction of the memory left after weights and activations"
        if cap is not None and cap * bpt < pool:
            pool, source = cap * bpt, "serving.max_tokens_in_paged_kv_cache"
    tpb = lim.tokens_per_block
    blocks = pool // (bpt * tpb)
    per_seq = _ceil_div(lim.max_seq_len, tpb) * lim.max_beam_width
    per_work = _ceil_div(isl + osl, tpb) * lim.max_beam_width
    work_seqs = blocks // per_work
    kv = KVPlan(dtype_bytes=kv_dtype_bytes, kv_heads_per_rank=max(1, _ceil_div(shape.num_key_value_heads, tp)),
                bytes_per_token=bpt, pool_bytes=pool, pool_source=source, tokens_per_block=tpb, blocks=blocks,
                capacity_tokens=blocks * tpb, blocks_per_max_seq=per_seq, max_seq_len_sequences=blocks // per_seq,
                workload_isl=isl, workload_osl=osl, workload_sequences=work_seqs * dp,
                workload_concurrency=min(work_seqs, lim.max_batch_size) * dp)
    ctx_logits = context_logits_bytes(shape.vocab_size, par.world_size, lim.max_num_tokens) \
        if lim.gather_context_logits and build.runtime.builds_trt_engine else 0
    memory = MemoryPlan(device_bytes=device, reserve_bytes=reserve, weights_bytes_per_rank=weights,
                        weights_bytes_by_pp_rank=per_pp, weights_breakdown=breakdown, params_total=params,
                        params_active=active,
                        activation_bytes=acts, free_bytes_after_weights_and_activations=free, kv=kv,
                        draft_weights_bytes=draft_weights, context_logits_bytes=ctx_logits, lora_cache_bytes=lora_cache,
                        total_bytes=reserve + weights + draft_weights + acts + ctx_logits + lora_cache + pool)

    plugins = plugin_decisions(build, target.sm, shape.architecture)

    gpn = par.gpus_per_node or target.gpus_per_node
    code = source_code(build, hf_config)
    plan = Plan(build=build.name, target=target.name, runtime=s.runtime, dtype=s.dtype, quant_algo=q.quant_algo,
                tensorrt_llm_versions=build.runtime.tensorrt_llm_versions,
                trtllm_quant_algo=pq.quant_algo if pq else build.recipe.quant_algo,
                kv_cache_quant_algo=q.kv_cache_quant_algo,
                tp_size=par.tp_size, pp_size=par.pp_size, world_size=par.world_size, serving_tp=tp, serving_pp=pp,
                attention_dp_size=dp,
                gpus_available=gpn * par.num_nodes if target.kind == "gpu" else 1, target_sm=target.sm,
                target_memory_gib=target.memory_gib, model=shape, vocab_padded=vocab_padded,
                checkpoint_format=fmt, moe_tp_size=moe_tp if shape.is_moe else 1,
                moe_ep_size=moe_ep if shape.is_moe else 1,
                limits=lim, memory=memory, plugins=plugins, plugins_apply=build.runtime.builds_trt_engine,
                speculative=spec, lora=lora, source_quantization=pq.record() if pq else None,
                runtime_settings=(portable_runtime_settings(build, kv.capacity_tokens if target.kind == "gpu" else None)
                                  if build.runtime.settings else []),
                admission=admission_plan(lim.max_batch_size, s.serving.max_queue_size),
                warnings=[], trust_remote_code=build.model.trust_remote_code, custom_code=code)
    warnings = [text for _, text in plan_warnings(PlanFacts(plan, build, target, hf_config))]
    return plan.model_copy(update={"warnings": warnings})


def prequant_of(hf_config: dict):
    """builders.prequant.detect of config.json alone (None: unquantized, or a quantization the rules refuse)."""
    from builders.prequant import detect

    try:
        return detect(hf_config)
    except SpecError:
        return None


def source_code(build: ResolvedBuild, hf_config: dict) -> list[CustomCode]:
    """The Python code of the checkpoint's own that a load of ``build``'s model would run with
    model.trust_remote_code (the ``auto_map`` entries of ``hf_config`` and of the tokenizer_config.json of a local
    ``model.source``), each with what transformers loads in its place without it
    (builders.model_fetch.code_stand_ins)."""
    from builders.model_fetch import code_stand_ins

    source = build.model.source
    return [CustomCode(entry=str(e), library_class=cls)
            for e, cls in code_stand_ins(hf_config, None if source.startswith("embedded:") else source)]


def read_hf_config(hf_dir: Path) -> dict:
    """The model's ``config.json`` as a dict (raise SpecError when it is missing)."""
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise SpecError([Problem("model.source", str(hf_dir), "the model folder has no config.json",
                                 "point model.source at an HF checkpoint folder", code="model_missing")])
    cfg = json.loads(path.read_text())
    cfg.setdefault("_name_or_path", str(hf_dir))  # so errors about the config name the folder
    return cfg

