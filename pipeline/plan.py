"""The pre-flight planner: memory and capability plan of one build on one target.

:func:`compute_plan` is a pure function of the resolved build, the target profile and the
model's Hugging Face ``config.json`` dict (no weights). It returns a :class:`Plan` that
serialises to ``plan.json``: per-rank weight, activation and KV-cache bytes, the KV pool's
capacity in tokens, blocks and sequences, the resolved ``trtllm-build`` plugin set (each with
its reason) and warnings. It never raises on a broken rule; :func:`make_plan` runs the rules of
:mod:`pipeline.preflight` and raises one :class:`~pipeline.errors.SpecError` listing them all.

All byte counts are bytes (not KiB/MiB); "per rank" means one GPU of the serving world
(tp_size x pp_size) and, under pipeline parallelism, the heaviest pipeline stage.

Sources: TensorRT-LLM "Memory Usage of TensorRT-LLM"
(https://nvidia.github.io/TensorRT-LLM/reference/memory.html: weights, activations fixed at
build time by the max shapes, KV pool = ``free_gpu_memory_fraction`` of the memory left);
shared/reference/trtllm.md (checkpoint layout, sharding, KV bytes per token).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from builders.quantize import QUANT_RECIPES
from pipeline.errors import Problem, SpecError
from pipeline.spec import ResolvedBuild
from pipeline.targets import TargetProfile

GIB = 1024 ** 3
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
ENGINE_RUNTIMES = ("trtllm", "trtllm-llmapi")
"""Runtimes that keep the checkpoint quantized and sharded over tp_size x pp_size GPUs. The
portable ``pytorch`` runtime serves the merged, dequantized weights on one device."""
GPU_RUNTIME_RESERVE_BYTES = 1 * GIB
"""Per-GPU memory the plan sets aside for the CUDA context, cuBLAS/NCCL workspaces and the
runtime's own buffers (an estimate: 0.5-1 GiB is what a CUDA 12 context plus TensorRT-LLM's
workspaces take in practice). CPU targets reserve nothing: memory_gib is already a budget."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelShape(_Frozen):
    """The dimensions of a decoder-only model that the plan needs (from HF config.json)."""

    architecture: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: Optional[int]
    rope_scaling_type: Optional[str]
    """``rope_scaling.rope_type`` when it is not ``default`` (long-context scaling), else null."""
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, cfg: dict, field: str = "model.source") -> "ModelShape":
        """Read the shape from an HF ``config.json`` dict; raise SpecError naming missing keys."""
        required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
        missing = [k for k in required if not isinstance(cfg.get(k), int)]
        if missing:
            raise SpecError([Problem(field, cfg.get("_name_or_path"), f"the model's config.json lacks {missing}",
                                     "point model.source at a decoder-only HF checkpoint (Llama family)",
                                     code="model_config")])
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
        return cls(
            architecture=(cfg.get("architectures") or ["LlamaForCausalLM"])[0],
            num_hidden_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
            num_attention_heads=heads, num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg.get("intermediate_size") or 4 * cfg["hidden_size"],
            vocab_size=cfg["vocab_size"], max_position_embeddings=cfg.get("max_position_embeddings"),
            rope_scaling_type=None if rope_type in (None, "default") else str(rope_type),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)))


class PluginEntry(_Frozen):
    flag: str
    value: str
    reason: str
    implicit: bool


class RuntimeSetting(_Frozen):
    """One setting of the portable runtime's continuous batching, as config.pbtxt will hold it."""

    name: str
    value: str
    reason: str


# The portable (pytorch) runtime's fixed choices and why: plan.json's runtime_settings and the
# tensorrt_llm model's config.pbtxt parameters (model_repo.generate) both take them from here.
# Measurements: docs/benchmarks/h200.md.
PORTABLE_RUNTIME_CHOICES: tuple[tuple[str, str, str], ...] = (
    ("cuda_graph_mode", "auto", "transformers decides (on the H200 it used no graphs for the paged SDPA path; "
     "with its default 90% KV share, graph warm-up ran out of memory there; docs/benchmarks/h200.md)"),
    ("async_batching", "false", "the per-request sampling processors (sampling.py) need synchronous batching; "
     "on the H200 transformers' async double-buffering was also far slower (docs/benchmarks/h200.md)"),
    ("library_defaults", "false", "the planner's sizes (KV pool, blocks, batch token budget), not transformers' "
     "own: on the H200 not slower beyond the run-to-run spread at 8 of 9 paired points (docs/benchmarks/h200.md)"),
    ("engine_process", "true", "the generation loop in its own process (engine_worker.py), so returning tokens "
     "does not share the stub's interpreter with it: on the H200 (8B shape) 1.25-1.7x the output tok/s of the "
     "loop in the stub at 1-128 users (docs/benchmarks/h200.md); false: the loop in the stub, responses sent per "
     "response_dispatch"),
    ("engine_python", "", "the worker's python (empty: one of the stub's Python version: its interpreter, the "
     "one under its prefix, or on PATH)"),
    ("sdpa_backends", "flash,mem_efficient,math", "every attention kernel but cuDNN's: on the H200 (8B shape) "
     "cuDNN attention made the first visit of each batch shape up to 2.8x slower (per-shape plans) and served "
     "traffic kept meeting new shapes; without it, served output tok/s was 1.12-1.22x at 32 and 128 users and "
     "first visits ran as fast as later ones; 1 user was 0.70-0.75x, not explained (docs/benchmarks/h200.md, "
     "sixth session). 'auto': torch's own choice, cuDNN included (process-wide where the generation loop runs)"),
    ("response_dispatch", "thread", "engine_process false only: a dispatcher thread sends the responses, so each "
     "send's round trip overlaps the next step ('inline': the generation thread sends them between steps)"),
)


def portable_kv_tokens(max_batch_size: int, max_seq_len: int, kv_cap: Optional[int],
                       pool_tokens: Optional[int]) -> tuple[int, str]:
    """KV slots (tokens) the pytorch runtime allocates, and where the number comes from: the spec's cap,
    else the planner's pool on a GPU (``pool_tokens``, memory.kv.capacity_tokens; None on CPU), else
    max_batch_size x max_seq_len. One rule for plan.json and config.pbtxt."""
    if kv_cap:
        return kv_cap, "spec: serving.max_tokens_in_paged_kv_cache"
    if pool_tokens:
        return pool_tokens, ("plan: memory.kv.capacity_tokens (serving.kv_cache_free_gpu_mem_fraction of the GPU "
                             "memory left after weights and activations; allocated once, like the TensorRT-LLM "
                             "backend's pool)")
    return max_batch_size * max_seq_len, "plan: max_batch_size x max_seq_len (every slot can hold a full sequence)"


def portable_runtime_settings(lim, kv: "KVPlan", gpu: bool, kv_cap: Optional[int]) -> list[RuntimeSetting]:
    """The pytorch runtime's continuous-batching settings with their reasons (plan.json runtime_settings)."""
    tokens, kv_reason = portable_kv_tokens(lim.max_batch_size, lim.max_seq_len, kv_cap,
                                           kv.capacity_tokens if gpu else None)
    fixed = [
        ("max_tokens_in_paged_kv_cache", tokens, kv_reason),
        ("tokens_per_block", lim.tokens_per_block, "limits.tokens_per_block: the paged cache's block size"),
        ("max_num_tokens", lim.max_num_tokens, "limits.max_num_tokens: tokens one generation step may schedule "
                                               "(transformers' max_batch_tokens)"),
        ("max_batch_size", lim.max_batch_size, "limits.max_batch_size: requests one step may hold "
                                               "(transformers' max_requests_per_batch)"),
    ]
    return [RuntimeSetting(name=n, value=str(v), reason=r) for n, v, r in (*fixed, *PORTABLE_RUNTIME_CHOICES)]


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
    """How many ISL+OSL sequences fit in the pool at once."""
    workload_concurrency: int
    """min(workload_sequences, max_batch_size): in-flight requests of that shape."""


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
    """Parameters of the whole model (unsharded, lm_head counted once per checkpoint tensor)."""
    activation_bytes: int
    """Estimate of the activation memory fixed at build time (formula in activation_bytes())."""
    free_bytes_after_weights_and_activations: int
    kv: KVPlan
    total_bytes: int
    """reserve + weights + activations + KV pool on one rank."""


class Plan(_Frozen):
    """What a build will be, on which hardware, with which memory: the content of plan.json."""

    build: str
    target: str
    runtime: str
    dtype: str
    quant_algo: str
    trtllm_quant_algo: Optional[str]
    kv_cache_quant_algo: Optional[str]
    tp_size: int
    pp_size: int
    world_size: int
    serving_tp: int
    """Tensor parallelism the runtime serves with (1 for the portable pytorch runtime)."""
    serving_pp: int
    gpus_available: int
    """gpus_per_node x num_nodes (1 on CPU targets)."""
    target_sm: Optional[int]
    target_memory_gib: float
    model: ModelShape
    vocab_padded: int
    """vocab_size rounded up to a multiple of serving_tp (lm_head rows)."""
    limits: dict[str, int]
    memory: MemoryPlan
    plugins: list[PluginEntry]
    runtime_settings: list[RuntimeSetting] = []
    """The pytorch runtime's continuous-batching settings and why (empty for the TensorRT-LLM runtimes)."""
    plugins_apply: bool
    """True when the runtime builds a TensorRT engine (trtllm); otherwise the list is informative."""
    warnings: list[str]

    def to_json(self) -> dict:
        return self.model_dump(mode="json")

    def write(self, path: Path) -> Path:
        """Write plan.json atomically to ``path``."""
        from pipeline.fsutil import write_json

        write_json(Path(path), self.to_json())
        return Path(path)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def linear_bytes(n_in: int, n_out: int, quant_algo: str, group_size: int, dtype_bytes: int) -> tuple[int, int]:
    """(weight bytes, scale bytes) of one linear layer shard ``n_in x n_out`` under a recipe.

    16-bit: 2 B/param. FP8: 1 B/param + two per-tensor FP32 scales (weight, activation).
    INT8 SmoothQuant: 1 B/param + one FP32 scale per output channel + a per-tensor activation
    scale. INT4 AWQ (W4A16/W4A8): 0.5 B/param, one 16-bit scale per ``group_size`` inputs per
    output (``weights_scaling_factor (out, in/group)``) and a 16-bit ``prequant_scaling_factor
    (in,)``; W4A8 adds per-tensor FP32 scales (shared/reference/trtllm.md, "Checkpoint format").
    """
    recipe = QUANT_RECIPES[quant_algo]
    params = n_in * n_out
    if recipe.weight_bits >= 16:
        return params * dtype_bytes, 0
    weight = params * recipe.weight_bits // 8
    if recipe.uses_group_size:
        scales = n_out * _ceil_div(n_in, group_size) * dtype_bytes + n_in * dtype_bytes
        if recipe.quant_algo == "W4A8_AWQ":
            scales += 2 * 4
        return weight, scales
    if recipe.quant_algo == "W8A8_SQ_PER_CHANNEL":
        return weight, n_out * 4 + 4
    return weight, 2 * 4


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


def kv_bytes_per_token(shape: ModelShape, tp: int, pp: int, dtype_bytes: int) -> int:
    """KV bytes per token per rank = 2 x (layers/pp) x max(1, kv_heads/tp) x head_dim x dtype_bytes.

    K and V (the 2) for each of the rank's layers; when kv_heads < tp, TensorRT-LLM duplicates
    KV heads so each rank holds one (shared/reference/trtllm.md, "Memory" and "GQA").
    Llama-3-8B: 2 x 32 x 8 x 128 x 2 = 131072 B (128 KiB) per token in BF16.
    """
    layers_rank = _ceil_div(shape.num_hidden_layers, pp)
    kv_rank = max(1, _ceil_div(shape.num_key_value_heads, tp))
    return 2 * layers_rank * kv_rank * shape.head_dim * dtype_bytes


def _weights(shape: ModelShape, tp: int, pp: int, quant_algo: str, group_size: int, dtype_bytes: int,
             quantized: bool, dedupe_tied: bool) -> tuple[list[int], dict[str, int], int]:
    """Per-PP-rank weight bytes (heaviest TP rank), the heaviest rank's breakdown, total params."""
    qa = quant_algo if quantized else "none"
    hd, h = shape.head_dim, shape.hidden_size
    q_rank = _ceil_div(shape.num_attention_heads, tp)
    kv_rank = max(1, _ceil_div(shape.num_key_value_heads, tp))
    inter_rank = _ceil_div(shape.intermediate_size, tp)
    # (in, out) of each linear shard: qkv/fc/gate column-parallel, dense/proj row-parallel.
    linears = [(h, (q_rank + 2 * kv_rank) * hd), (q_rank * hd, h), (h, inter_rank), (h, inter_rank), (inter_rank, h)]
    layer_w = layer_s = 0
    for n_in, n_out in linears:
        w, s = linear_bytes(n_in, n_out, qa, group_size, dtype_bytes)
        layer_w, layer_s = layer_w + w, layer_s + s
    layer_norms = 2 * h * dtype_bytes
    vocab_padded = _ceil_div(shape.vocab_size, tp) * tp
    embedding = shape.vocab_size * h * dtype_bytes          # replicated on the first PP rank
    lm_head = (vocab_padded // tp) * h * dtype_bytes       # split on dim 0, last PP rank, 16-bit
    if dedupe_tied and shape.tie_word_embeddings:
        lm_head = 0                                         # HF model: one shared tensor
    layers_rank = _ceil_div(shape.num_hidden_layers, pp)
    per_rank, breakdowns = [], []
    for r in range(pp):
        parts = {"layers": layers_rank * layer_w, "scales": layers_rank * layer_s,
                 "norms": layers_rank * layer_norms + (h * dtype_bytes if r == pp - 1 else 0),
                 "embedding": embedding if r == 0 else 0, "lm_head": lm_head if r == pp - 1 else 0}
        per_rank.append(sum(parts.values()))
        breakdowns.append(parts)
    heaviest = max(range(pp), key=lambda r: per_rank[r])
    n_layer = sum(i * o for i, o in (
        (h, (shape.num_attention_heads + 2 * shape.num_key_value_heads) * hd),
        (shape.num_attention_heads * hd, h), (h, shape.intermediate_size), (h, shape.intermediate_size),
        (shape.intermediate_size, h))) + 2 * h
    params = shape.num_hidden_layers * n_layer + h + shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    return per_rank, breakdowns[heaviest], params


def compute_plan(build: ResolvedBuild, target: TargetProfile, hf_config: dict, *, isl: int = 128,
                 osl: int = 128) -> Plan:
    """Plan ``build`` on ``target`` for the model described by ``hf_config`` (pure; no rule raises).

    Args:
        build: the resolved spec for one target.
        target: the hardware profile.
        hf_config: the model's HF ``config.json`` as a dict (no weights needed).
        isl, osl: input and output sequence length of the workload whose concurrency the plan
            reports (tokens).

    Returns:
        The plan. Rules are checked separately by :func:`pipeline.preflight.plan_problems`.
    """
    from plugins.resolve import resolve_plugins

    s = build.settings
    q, par, lim, sv = s.quantization, s.parallelism, s.limits, s.serving
    shape = ModelShape.from_hf_config(hf_config)
    engine = s.runtime in ENGINE_RUNTIMES
    tp, pp = (par.tp_size, par.pp_size) if engine else (1, 1)
    warnings: list[str] = []

    # dtypes: engine runtimes keep the checkpoint dtype and quantization; the portable runtime
    # dequantizes into the target's runtime_dtype (float32 on CPU).
    act_dtype = s.dtype if engine else target.runtime_dtype
    dtype_bytes = DTYPE_BYTES[act_dtype]
    kv_dtype_bytes = 1 if (engine and q.kv_cache_quant_algo == "fp8") else dtype_bytes
    per_pp, breakdown, params = _weights(shape, tp, pp, q.quant_algo, q.group_size, dtype_bytes,
                                         quantized=engine, dedupe_tied=not engine)
    weights = max(per_pp)
    vocab_padded = _ceil_div(shape.vocab_size, tp) * tp
    acts = activation_bytes(shape, tp, vocab_padded // tp, lim.max_num_tokens, lim.max_batch_size,
                            lim.max_beam_width, dtype_bytes)
    device = int(target.memory_gib * GIB)
    reserve = GPU_RUNTIME_RESERVE_BYTES if target.kind == "gpu" else 0
    free = device - reserve - weights - acts

    bpt = kv_bytes_per_token(shape, tp, pp, kv_dtype_bytes)
    cap = sv.max_tokens_in_paged_kv_cache
    if target.kind == "cpu":
        tokens = cap if cap is not None else lim.max_batch_size * lim.max_seq_len
        pool = tokens * bpt
        source = "serving.max_tokens_in_paged_kv_cache" if cap is not None else \
            "limits.max_batch_size x limits.max_seq_len (CPU targets allocate per sequence)"
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
                workload_isl=isl, workload_osl=osl, workload_sequences=work_seqs,
                workload_concurrency=min(work_seqs, lim.max_batch_size))
    memory = MemoryPlan(device_bytes=device, reserve_bytes=reserve, weights_bytes_per_rank=weights,
                        weights_bytes_by_pp_rank=per_pp, weights_breakdown=breakdown, params_total=params,
                        activation_bytes=acts, free_bytes_after_weights_and_activations=free, kv=kv,
                        total_bytes=reserve + weights + acts + pool)

    decisions = resolve_plugins(
        quant_algo=q.quant_algo, kv_cache_quant_algo=q.kv_cache_quant_algo, dtype=s.dtype, sm=target.sm,
        tp_size=par.tp_size, pp_size=par.pp_size, architecture=shape.architecture,
        tokens_per_block=tpb, enable_kv_cache_reuse=sv.enable_kv_cache_reuse,
        enable_chunked_context=sv.enable_chunked_context, use_fp8_context_fmha=q.use_fp8_context_fmha,
        strict=False)
    plugins = [PluginEntry(flag=d.flag, value=d.value, reason=d.reason, implicit=d.implicit) for d in decisions]

    # Warnings: facts worth knowing that are not errors.
    if engine and shape.num_key_value_heads < tp:
        warnings.append(f"num_key_value_heads ({shape.num_key_value_heads}) < tp_size ({tp}): each rank holds a "
                        f"duplicated KV head, so KV memory per rank is that of 1 head, not "
                        f"{shape.num_key_value_heads}/{tp} (counted in the plan)")
    if vocab_padded != shape.vocab_size:
        warnings.append(f"vocab_size {shape.vocab_size} padded to {vocab_padded} (a multiple of tp_size {tp}) for "
                        "the lm_head split (counted in the plan)")
    if not engine and (par.tp_size > 1 or par.pp_size > 1):
        warnings.append(f"runtime '{s.runtime}' serves the merged checkpoint on one device: tp_size/pp_size "
                        f"({par.tp_size}/{par.pp_size}) only shape the exported checkpoint")
    if not engine and QUANT_RECIPES[q.quant_algo].weight_bits < 16:
        warnings.append(f"runtime '{s.runtime}' dequantizes weights to {act_dtype}: {q.quant_algo} changes "
                        "accuracy and disk size, not serving memory")
    gpn = par.gpus_per_node or target.gpus_per_node
    if engine and tp > gpn:
        warnings.append(f"tp_size {tp} > gpus_per_node {gpn}: tensor parallelism crosses nodes (all-reduce over "
                        "the network each layer); prefer pp across nodes")
    if lim.max_num_tokens > lim.max_batch_size * lim.max_seq_len:
        warnings.append(f"max_num_tokens {lim.max_num_tokens} > max_batch_size x max_seq_len "
                        f"({lim.max_batch_size * lim.max_seq_len}): TensorRT-LLM clamps it to the latter")
    if 0 < kv.workload_sequences < lim.max_batch_size:
        warnings.append(f"the KV pool holds {kv.workload_sequences} sequences of {isl}+{osl} tokens, fewer than "
                        f"max_batch_size {lim.max_batch_size}: in-flight batches of that shape are KV-bound")
    if (target.kind == "gpu" and engine and target.fp8 and q.quant_algo == "none"
            and q.kv_cache_quant_algo is None):
        warnings.append(f"target {target.name} has FP8 tensor cores; quant_algo fp8 would halve weight memory")

    return Plan(build=build.name, target=target.name, runtime=s.runtime, dtype=s.dtype, quant_algo=q.quant_algo,
                trtllm_quant_algo=QUANT_RECIPES[q.quant_algo].quant_algo, kv_cache_quant_algo=q.kv_cache_quant_algo,
                tp_size=par.tp_size, pp_size=par.pp_size, world_size=par.world_size, serving_tp=tp, serving_pp=pp,
                gpus_available=gpn * par.num_nodes if target.kind == "gpu" else 1, target_sm=target.sm,
                target_memory_gib=target.memory_gib, model=shape, vocab_padded=vocab_padded,
                limits=lim.model_dump(), memory=memory, plugins=plugins, plugins_apply=s.runtime == "trtllm",
                runtime_settings=(portable_runtime_settings(lim, kv, target.kind == "gpu", cap)
                                  if s.runtime == "pytorch" else []),
                warnings=warnings)


def read_hf_config(hf_dir: Path) -> dict:
    """The model's ``config.json`` as a dict (raise SpecError when it is missing)."""
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise SpecError([Problem("model.source", str(hf_dir), "the model folder has no config.json",
                                 "point model.source at an HF checkpoint folder", code="model_missing")])
    cfg = json.loads(path.read_text())
    cfg.setdefault("_name_or_path", str(hf_dir))  # so errors about the config name the folder
    return cfg


def make_plan(build: ResolvedBuild, target: TargetProfile, hf_config: dict, *, isl: int = 128,
              osl: int = 128) -> Plan:
    """Check every rule (spec, model, memory) and return the plan; raise SpecError listing all problems."""
    from pipeline import preflight

    problems = preflight.spec_problems(build, target)
    problems += preflight.model_problems(build, hf_config, target)
    if problems:
        raise SpecError(problems, build.spec_path)
    return compute_plan(build, target, hf_config, isl=isl, osl=osl)


def human_bytes(n: Any) -> str:
    """``n`` bytes as a short string in binary units (KiB, MiB, GiB)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
