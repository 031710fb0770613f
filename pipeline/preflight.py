"""Pre-flight rules that run before any heavy step (all problems reported at once).

``check(build, target)`` needs only the spec and the target profile; ``check_model(build,
target, hf_dir)`` also reads the model's config.json (no weights) and checks the memory plan
of :mod:`pipeline.plan`. Each rule appends a :class:`~pipeline.errors.Problem` naming the
YAML field (``targets.<t>.<field>`` when the target overrides it), the value, the rule and the
fix, with a stable ``code``. Sources are cited next to each rule; "trtllm.md" and "triton.md"
are shared/reference/, summarised from TensorRT-LLM 1.2 and its Triton backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from builders.quantize import QUANT_RECIPES
from pipeline.errors import Problem, SpecError
from pipeline.spec import ResolvedBuild
from pipeline.targets import TargetProfile
from plugins.resolve import FP8_CONTEXT_FMHA_ALGOS, SM_FP8_MIN, SM_INT4_WO_REFUSED, fp8_context_fmha_problem

ENGINE_RUNTIMES = ("trtllm", "trtllm-llmapi")
# SM gates live in plugins/resolve.py (SM_FP8_MIN: FP8 tensor cores from Ada, ModelOpt support matrix "GPUs:
# Ada and Later"; SM_FP8_CONTEXT_FMHA: attentionOp.cpp's set; SM_INT4_WO_REFUSED: trtllm-build 1.2 refuses
# INT4/INT8 weight-only engines on SM 100-119, the trtllm engine path only).
FP8_WEIGHT_ALGOS = FP8_CONTEXT_FMHA_ALGOS  # FP8 tensor-core weights among our recipes: fp8, w4a8_awq
WEIGHT_ONLY_INT_ALGOS = ("W4A16_AWQ", "W4A16", "W4A16_GPTQ", "W8A16")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def spec_problems(build: ResolvedBuild, target: TargetProfile) -> list[Problem]:
    """Rules that need only the spec and the target."""
    s = build.settings
    w = build.where
    q, par, lim, sv = s.quantization, s.parallelism, s.limits, s.serving
    recipe = QUANT_RECIPES[q.quant_algo]
    engine = s.runtime in ENGINE_RUNTIMES
    sm = target.sm
    problems: list[Problem] = []

    # Runtime availability: pytorch everywhere, engine runtimes on GPUs (DESIGN.md "Runtimes").
    if s.runtime not in target.runtimes:
        problems.append(Problem(w("runtime"), s.runtime, f"runtime '{s.runtime}' cannot run on target "
                                f"'{target.name}' (it supports {list(target.runtimes)})",
                                "use runtime: pytorch on CPU targets, or pick a GPU target", code="runtime_target"))

    # GPUs: world size = tp x pp ranks, one per GPU (triton.md "Launching": mpirun world size
    # = tp x pp; what breaks #8). Only engine runtimes shard over GPUs.
    gpn = par.gpus_per_node or target.gpus_per_node
    if par.gpus_per_node is not None and par.gpus_per_node > target.gpus_per_node:
        problems.append(Problem(w("parallelism.gpus_per_node"), par.gpus_per_node,
                                f"target '{target.name}' has {target.gpus_per_node} GPUs per node",
                                f"set parallelism.gpus_per_node <= {target.gpus_per_node} or remove it",
                                code="gpus_per_node_target"))
    if engine and target.kind == "gpu" and par.world_size > gpn * par.num_nodes:
        problems.append(Problem(w("parallelism.tp_size"), par.tp_size,
                                f"tp_size x pp_size = {par.tp_size} x {par.pp_size} = {par.world_size} ranks need "
                                f"{par.world_size} GPUs, but gpus_per_node x num_nodes = {gpn} x {par.num_nodes} = "
                                f"{gpn * par.num_nodes}", f"lower tp_size/pp_size or set parallelism.num_nodes >= "
                                f"{-(-par.world_size // gpn)}", code="world_size"))

    # Limits (trtllm.md "trtllm-build limits"; triton.md what breaks #5).
    if lim.max_seq_len < lim.max_input_len + 1:
        problems.append(Problem(w("limits.max_seq_len"), lim.max_seq_len,
                                f"max_seq_len must be at least max_input_len + 1 = {lim.max_input_len + 1} "
                                "(room for one generated token)",
                                f"set limits.max_seq_len >= {lim.max_input_len + 1}", code="seq_len_vs_input"))
    # Without chunked context a whole prompt is one context chunk, and one forward pass holds at
    # most max_num_tokens tokens: the executor refuses max_input_len > max_num_tokens unless
    # chunked context is on (TensorRT-LLM docs, "Tuning Max Batch Size and Max Num Tokens" and
    # "Long Sequences / Chunked Context": chunking decouples the prompt length from max_num_tokens).
    if not sv.enable_chunked_context and lim.max_num_tokens < lim.max_input_len:
        problems.append(Problem(w("limits.max_num_tokens"), lim.max_num_tokens,
                                f"max_num_tokens must be >= max_input_len ({lim.max_input_len}) when "
                                "enable_chunked_context is off: a whole prompt must fit in one forward pass",
                                f"set limits.max_num_tokens >= {lim.max_input_len} or "
                                "serving.enable_chunked_context: true", code="num_tokens_vs_input"))
    # "if chunked context is enabled, please set the max_num_tokens to be an integer multiple of
    # the kv-cache block size tokens_per_block" (TensorRT-LLM docs/source/features/long-sequence.md).
    if sv.enable_chunked_context and lim.max_num_tokens % lim.tokens_per_block:
        good = lim.max_num_tokens - lim.max_num_tokens % lim.tokens_per_block or lim.tokens_per_block
        problems.append(Problem(w("limits.max_num_tokens"), lim.max_num_tokens,
                                f"with chunked context max_num_tokens must be a multiple of tokens_per_block "
                                f"({lim.tokens_per_block})", f"set limits.max_num_tokens to {good}",
                                code="chunk_block_multiple"))

    # Triton (triton.md "Triton settings"; what breaks #4 and #11).
    tmbs = sv.triton_max_batch_size
    if tmbs is not None and tmbs > lim.max_batch_size:
        problems.append(Problem(w("serving.triton_max_batch_size"), tmbs,
                                f"Triton's max_batch_size must not exceed the engine's max_batch_size "
                                f"{lim.max_batch_size}", "lower it or raise limits.max_batch_size",
                                code="triton_batch_vs_engine"))
    if sv.decoupled is False and sv.streaming:
        problems.append(Problem(w("serving.decoupled"), False, "streaming needs the decoupled transaction policy "
                                "(model_transaction_policy { decoupled: true })",
                                "remove serving.decoupled or set it to true (or set serving.streaming: false)",
                                code="streaming_decoupled"))

    # Hardware gates of the engine runtimes. The portable runtime dequantizes, so it has none.
    if engine and sm is not None:
        fp8_weights = recipe.quant_algo in FP8_WEIGHT_ALGOS
        if fp8_weights and sm < SM_FP8_MIN:
            problems.append(Problem(w("quantization.quant_algo"), q.quant_algo,
                                    f"{recipe.quant_algo} needs FP8 tensor cores (SM >= {SM_FP8_MIN}); target "
                                    f"'{target.name}' is SM {sm}", "use int4_awq or int8_sq, or an Ada/Hopper/"
                                    "Blackwell target (l4, l40s, h100, h200, b200)", code="fp8_sm"))
        if q.kv_cache_quant_algo == "fp8" and sm < SM_FP8_MIN:
            problems.append(Problem(w("quantization.kv_cache_quant_algo"), "fp8",
                                    f"an FP8 KV cache needs SM >= {SM_FP8_MIN}; target '{target.name}' is SM {sm}",
                                    "set quantization.kv_cache_quant_algo: null, or pick an SM >= 89 target",
                                    code="fp8_kv_sm"))
        if s.runtime == "trtllm" and recipe.quant_algo in WEIGHT_ONLY_INT_ALGOS and sm in SM_INT4_WO_REFUSED:
            problems.append(Problem(w("quantization.quant_algo"), q.quant_algo,
                                    f"trtllm-build 1.2 refuses INT4/INT8 weight-only engines ({recipe.quant_algo}) "
                                    f"on SM 100-119; target '{target.name}' is SM {sm}",
                                    "use quant_algo fp8 (or w4a8_awq) on Blackwell, or runtime trtllm-llmapi",
                                    code="int4_sm100"))
        problems += _resolver_refusals(build, target, problems, w)
    # FP8 context FMHA: FP8/W4A8 checkpoints only, on the SMs whose kernels exist (plugins/resolve.py, one rule
    # for the plan, the resolver and here).
    problem = fp8_context_fmha_problem(recipe.quant_algo, sm if engine else None,
                                       w("quantization.use_fp8_context_fmha"))
    if q.use_fp8_context_fmha and problem is not None:
        problems.append(problem)

    # KV-cache reuse and chunked context need an engine built with paged context FMHA
    # (https://nvidia.github.io/TensorRT-LLM/advanced/kv-cache-reuse.html: "KV cache reuse
    # requires the model to be built for paged context attention"; triton.md what breaks #7).
    # The plugin resolver is the one place that decides the flag: check it agrees.
    said = {p.code for p in problems} & {"fp8_context_fmha_vs_kv_cache", "fp8_kv_paged_context"}
    if (sv.enable_kv_cache_reuse or sv.enable_chunked_context) and not said:
        from plugins.resolve import resolve_plugins

        decisions = resolve_plugins(
            quant_algo=q.quant_algo, kv_cache_quant_algo=q.kv_cache_quant_algo, dtype=s.dtype, sm=sm,
            tp_size=par.tp_size, pp_size=par.pp_size, architecture="LlamaForCausalLM",
            tokens_per_block=lim.tokens_per_block, enable_kv_cache_reuse=sv.enable_kv_cache_reuse,
            enable_chunked_context=sv.enable_chunked_context, use_fp8_context_fmha=q.use_fp8_context_fmha,
            strict=False)
        paged = {d.flag: d.value for d in decisions}.get("use_paged_context_fmha")
        if paged != "enable":
            which = "serving.enable_kv_cache_reuse" if sv.enable_kv_cache_reuse else "serving.enable_chunked_context"
            problems.append(Problem(w(which), True,
                                    f"needs an engine with use_paged_context_fmha enabled, but the plugin "
                                    f"resolution gives {paged!r}", "turn the option off, or fix plugins/resolve.py "
                                    "so that it enables use_paged_context_fmha", code="paged_context_fmha"))
    return problems


# Refusals the plugin resolver knows about that the rules above already report under their own code.
_SAME_RULE = {"fp8_sm": {"fp8_sm", "fp8_kv_sm"}, "int_wo_blackwell": {"int4_sm100"},
              "fp8_context_fmha_sm": {"fp8_context_fmha_sm"},
              "fp8_context_fmha_needs_fp8": {"fp8_context_fmha_needs_fp8"}}


def _resolver_refusals(build: ResolvedBuild, target: TargetProfile, found: list[Problem], w) -> list[Problem]:
    """What plugins.resolve_plugins refuses for this engine build, minus what ``found`` already says."""
    from plugins.resolve import resolve_plugins

    s = build.settings
    q, par, lim, sv = s.quantization, s.parallelism, s.limits, s.serving
    try:
        resolve_plugins(quant_algo=q.quant_algo, kv_cache_quant_algo=q.kv_cache_quant_algo, dtype=s.dtype,
                        sm=target.sm, tp_size=par.tp_size, pp_size=par.pp_size, architecture="LlamaForCausalLM",
                        tokens_per_block=lim.tokens_per_block, enable_kv_cache_reuse=sv.enable_kv_cache_reuse,
                        enable_chunked_context=sv.enable_chunked_context,
                        use_fp8_context_fmha=q.use_fp8_context_fmha)
    except SpecError as exc:
        have = {p.code for p in found}
        return [Problem(w(p.field), p.value, p.rule, p.fix, p.code) for p in exc.problems
                if not (_SAME_RULE.get(p.code, {p.code}) & have)]
    return []


def check(build: ResolvedBuild, target: TargetProfile) -> None:
    """Raise SpecError when the spec breaks a rule that needs no model files."""
    problems = spec_problems(build, target)
    if problems:
        raise SpecError(problems, build.spec_path)


def model_problems(build: ResolvedBuild, hf_config: dict, target: Optional[TargetProfile] = None) -> list[Problem]:
    """Rules that need the model's config.json: sharding divisibility, context length and,
    when ``target`` is given, the memory plan (weights + activations + KV fit; one sequence fits)."""
    from pipeline.plan import ModelShape

    s = build.settings
    w = build.where
    q, par, lim = s.quantization, s.parallelism, s.limits
    tp, pp = par.tp_size, par.pp_size
    m = ModelShape.from_hf_config(hf_config)
    problems: list[Problem] = []

    # Sharding (trtllm.md "Every sharded dimension must divide"; ModelOpt's exporter splits
    # heads by tp and layers evenly by pp).
    if m.num_attention_heads % tp:
        problems.append(Problem(w("parallelism.tp_size"), tp, f"num_attention_heads ({m.num_attention_heads}) must "
                                "be divisible by tp_size", f"use tp_size in {_divisors(m.num_attention_heads)}",
                                code="heads_tp"))
    kv = m.num_key_value_heads
    # GQA: kv_heads >= tp must split evenly; kv_heads < tp are duplicated, which needs tp % kv == 0
    # (trtllm.md "GQA: when num_key_value_heads < tp, K/V heads are duplicated up to tp").
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        problems.append(Problem(w("parallelism.tp_size"), tp, f"num_key_value_heads ({kv}) must be divisible by "
                                "tp_size, or tp_size by it (KV heads are duplicated when fewer than tp)",
                                f"use tp_size in {sorted(set(_divisors(kv)) | {kv * k for k in (2, 4, 8)})} "
                                "that also divides num_attention_heads", code="kv_heads_tp"))
    if m.intermediate_size % tp:
        problems.append(Problem(w("parallelism.tp_size"), tp, f"intermediate_size ({m.intermediate_size}) must be "
                                "divisible by tp_size (the MLP is split by columns/rows across ranks)",
                                f"use tp_size in {[d for d in _divisors(m.num_attention_heads) if m.intermediate_size % d == 0]}",
                                code="intermediate_tp"))
    if m.num_hidden_layers % pp:
        problems.append(Problem(w("parallelism.pp_size"), pp, f"num_hidden_layers ({m.num_hidden_layers}) must be "
                                "divisible by pp_size (ModelOpt's exporter splits layers evenly)",
                                f"use pp_size in {_divisors(m.num_hidden_layers)}", code="layers_pp"))
    # AWQ: the group size must divide every per-rank input dimension of a quantized linear
    # layer (trtllm.md: "(dim / tp) % group_size == 0 for AWQ (e.g. 11008/4 = 2752 is not a
    # multiple of 128: a known failure)"). Column-parallel layers (qkv, fc, gate) keep their
    # input (hidden); row-parallel layers split it: o_proj gets heads x head_dim / tp, down_proj
    # gets intermediate / tp.
    if QUANT_RECIPES[q.quant_algo].uses_group_size:
        dims = {"hidden_size (qkv/gate/up input)": m.hidden_size,
                "num_attention_heads x head_dim / tp (o_proj input)": m.num_attention_heads * m.head_dim // tp,
                "intermediate_size / tp (down_proj input)": m.intermediate_size // tp}
        bad = {k: v for k, v in dims.items() if v % q.group_size}
        if bad:
            ok = [g for g in (32, 64, 128, 256) if all(v % g == 0 for v in dims.values())]
            problems.append(Problem(w("quantization.group_size"), q.group_size,
                                    "group_size must divide every per-rank sharded input dimension; "
                                    + ", ".join(f"{k} = {v}" for k, v in bad.items()) + " is not a multiple",
                                    f"use group_size in {ok}" if ok else "change tp_size", code="awq_group"))
    # Context length: RoPE models are trained up to max_position_embeddings; longer needs a
    # rope scaling entry in config.json (rope_type linear/dynamic/yarn/llama3).
    if m.max_position_embeddings and lim.max_seq_len > m.max_position_embeddings and m.rope_scaling_type is None:
        problems.append(Problem(w("limits.max_seq_len"), lim.max_seq_len,
                                f"above the model's max_position_embeddings {m.max_position_embeddings} with no "
                                "rope scaling", f"set limits.max_seq_len <= {m.max_position_embeddings}",
                                code="seq_len_context"))
    if target is not None and not any(p.code in ("heads_tp", "kv_heads_tp", "intermediate_tp", "layers_pp") for p in problems):
        problems += memory_problems(build, target, hf_config)
    return problems


def memory_problems(build: ResolvedBuild, target: TargetProfile, hf_config: dict) -> list[Problem]:
    """Memory rules on the plan (trtllm.md "Memory"; triton.md what breaks #6): weights +
    activations fit the device, and the KV pool holds at least one max_seq_len sequence."""
    from pipeline.plan import compute_plan, human_bytes

    w = build.where
    s = build.settings
    plan = compute_plan(build, target, hf_config)
    mem, kv = plan.memory, plan.memory.kv
    problems: list[Problem] = []
    dev = human_bytes(mem.device_bytes)
    if mem.reserve_bytes + mem.weights_bytes_per_rank > mem.device_bytes:
        problems.append(Problem(w("quantization.quant_algo"), s.quantization.quant_algo,
                                f"weights take {human_bytes(mem.weights_bytes_per_rank)} per rank (+ "
                                f"{human_bytes(mem.reserve_bytes)} runtime reserve), more than the {dev} of "
                                f"'{target.name}'", "raise parallelism.tp_size/pp_size, quantize (int4_awq, fp8), "
                                "or pick a target with more memory", code="weights_fit"))
    elif mem.free_bytes_after_weights_and_activations <= 0:
        problems.append(Problem(w("limits.max_num_tokens"), s.limits.max_num_tokens,
                                f"weights {human_bytes(mem.weights_bytes_per_rank)} + activations "
                                f"{human_bytes(mem.activation_bytes)} + reserve {human_bytes(mem.reserve_bytes)} "
                                f"exceed the {dev} of '{target.name}'", "lower limits.max_num_tokens or "
                                "limits.max_batch_size, or raise tp_size", code="activations_fit"))
    elif target.kind == "cpu" and mem.total_bytes > mem.device_bytes:
        problems.append(Problem(w("limits.max_batch_size"), s.limits.max_batch_size,
                                f"weights + activations + KV ({human_bytes(mem.total_bytes)}) exceed the {dev} "
                                f"budget of '{target.name}'", "lower limits.max_batch_size or limits.max_seq_len, "
                                "or set serving.max_tokens_in_paged_kv_cache", code="memory_fit"))
    elif kv.max_seq_len_sequences < 1:
        capped = kv.pool_source == "serving.max_tokens_in_paged_kv_cache"
        field = "serving.max_tokens_in_paged_kv_cache" if capped else "serving.kv_cache_free_gpu_mem_fraction"
        value = s.serving.max_tokens_in_paged_kv_cache if capped else s.serving.kv_cache_free_gpu_mem_fraction
        need = kv.blocks_per_max_seq * kv.tokens_per_block
        problems.append(Problem(w(field), value,
                                f"the KV pool holds {kv.capacity_tokens} tokens ({kv.blocks} blocks), less than one "
                                f"max_seq_len sequence ({need} tokens)",
                                f"allow >= {need} tokens ({human_bytes(need * kv.bytes_per_token)}), lower "
                                "limits.max_seq_len, or use an FP8 KV cache", code="kv_pool_one_seq"))
    return problems


# Architectures whose checkpoints ModelOpt's `llama` decoder exports and our reader merges (Llama layout:
# q/k/v/o, gate/up/down, RMSNorm). Others fail deep inside calibration or export; refuse them up front.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")


def architecture_problems(hf_config: dict, where: str) -> list[Problem]:
    """A Problem when config.json names an architecture the pipeline cannot export and read back."""
    archs = hf_config.get("architectures") or []
    if archs and archs[0] not in SUPPORTED_ARCHITECTURES:
        return [Problem("model.source", where, f"config.json architecture {archs[0]} is not supported (the "
                        f"pipeline exports and reads back the Llama layout: {', '.join(SUPPORTED_ARCHITECTURES)})",
                        "use a Llama-family checkpoint (Llama, Mistral, SmolLM2...)", code="architecture")]
    return []


def check_model(build: ResolvedBuild, target: TargetProfile, hf_dir: Path) -> None:
    """Raise SpecError when the spec does not fit the model in ``hf_dir`` on ``target``."""
    from pipeline.plan import read_hf_config

    cfg = read_hf_config(hf_dir)
    problems = architecture_problems(cfg, str(hf_dir))
    if not problems:  # the shape rules assume a Llama-family config
        problems = model_problems(build, cfg, target)
    if problems:
        raise SpecError(problems, build.spec_path)
