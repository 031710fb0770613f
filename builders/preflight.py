"""Pre-flight rules that run before any heavy step (all problems reported at once).

``check(build, target)`` needs only the spec and the target profile; :func:`make_plan` (and
:func:`check_model`, which reads the model folder) also reads the model's config.json (no weights) and, given
``hf_dir`` (the build does), its safetensors headers (builders.source_tensors: a broken checkpoint is refused
before any stage), checks the shape and memory rules, and returns the build's one :class:`~builders.plan.Plan`. Each
rule appends a :class:`~plugins.errors.Problem` naming the YAML field (``targets.<t>.<field>`` when the
target overrides it), the value, the rule and the fix, with a stable ``code``. Rules ask the
registries' traits (plugins.runtimes, plugins.recipes, plugins.architectures); the SM gates and the
plugin decisions are plugins.resolve's, called from here and from the planner. Sources are cited
next to each rule.
"""

from __future__ import annotations

from pathlib import Path

from builders import fix_choices
from builders.llmapi_options import RELEASES, llm_api_options, option_problems
from builders.model_shape import ModelShape, rope_context
from builders.plan import Plan, compute_plan, draft_config, layer_shards, plugin_decisions, read_hf_config, source_code
from builders.plan_warnings import human_bytes
from builders.spec import ResolvedBuild, ServingConfig
from plugins.architectures import ARCHITECTURES, ROPE_TYPES, Architecture, architecture, support
from plugins.recipes import QUANT_RECIPES
from plugins.runtimes import RUNTIMES
from plugins.errors import Problem, SpecError
from plugins.resolve import HARDWARE_CODES, MMHA_HEAD_SIZES, decode_attention_kernel, hardware_problems
from plugins.targets import TargetProfile, get_target

SHARDING_CODES = ("heads_tp", "kv_heads_tp", "intermediate_tp", "layers_pp", "moe_sizes", "experts_ep",
                  "expert_intermediate_tp")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _awq_dims(m: ModelShape, tp: int, moe_tp: int, moe_ep: int) -> dict[str, int]:
    """The per-rank input dimension of every linear layer the AWQ group size must divide, one entry per distinct
    value: ``{"qkv/gate_proj/up_proj input": 576, ...}`` (the architecture's linear shards, MoE layers and, where
    a MoE model has them, its dense layers)."""
    shards = [sh for moe_layer in {False: [False], True: [True, m.moe_layers < m.num_hidden_layers]}[m.is_moe]
              for sh in layer_shards(m, tp, moe_tp, moe_ep, moe_layer=moe_layer)]
    dims: dict[str, int] = {}
    for shard in shards:
        label = next((k for k, v in dims.items() if v == shard.n_in), None)
        if label is None:
            dims[f"{shard.name} input"] = shard.n_in
        else:
            dims[label.replace(" input", f"/{shard.name} input")] = dims.pop(label)
    return dims


def _groups_fit(m: ModelShape, tp: int, moe_tp: int, moe_ep: int, group_size: int | None) -> bool:
    return group_size is None or all(v % group_size == 0 for v in _awq_dims(m, tp, moe_tp, moe_ep).values())


def moe_splits(m: ModelShape, tp: int, group_size: int | None = None) -> list[tuple[int, int]]:
    """The (moe_tp_size, moe_ep_size) splits of ``tp`` that pass every expert rule of :func:`moe_problems` (and,
    with ``group_size``, the AWQ group rule) of the MoE model ``m``."""
    return [(t, tp // t) for t in _divisors(tp) if m.num_experts % (tp // t) == 0 and m.moe_intermediate_size % t == 0
            and _groups_fit(m, tp, t, tp // t, group_size)]


def _tp_fits(m: ModelShape, tp: int, group_size: int | None = None) -> bool:
    """tp passes every tp rule of :func:`model_problems` together: it splits the heads, the KV heads (or
    duplicates them evenly), the dense MLP, the shared expert, leaves some valid expert split (MoE) and, with
    ``group_size`` (INT4 recipes), keeps every per-rank linear input a multiple of it."""
    kv = m.num_key_value_heads
    dense_ok = m.moe_layers == m.num_hidden_layers or m.intermediate_size % tp == 0
    if not (m.num_attention_heads % tp == 0 and dense_ok
            and ((kv >= tp and kv % tp == 0) or (kv < tp and tp % kv == 0))):
        return False
    if m.is_moe:
        return m.shared_expert_intermediate_size % tp == 0 and bool(moe_splits(m, tp, group_size))
    return _groups_fit(m, tp, 1, 1, group_size)


def _tp_fix(m: ModelShape, group_size: int | None) -> str:
    """The one fix of every tp rule: the tp sizes that pass them all (with the AWQ group size when it applies)."""
    valid = valid_tp_sizes(m, group_size)
    if valid:
        return f"use tp_size in {valid}"
    return (f"no tp_size keeps every per-rank input a multiple of group_size {group_size}: use tp_size in "
            f"{valid_tp_sizes(m)} with a quantization.group_size that divides them (see awq_group)")


def spec_problems(build: ResolvedBuild, target: TargetProfile, arch: Architecture | None = None) -> list[Problem]:
    """Rules that need only the spec and the target. A fix that names a runtime or a quantization names only one
    that passes the rules on ``target`` (builders.fix_choices), and, given the model's family ``arch`` (when its
    config.json is at hand), the family support rule too."""
    s = build.settings
    where = build.where
    q, par, lim, sv = s.quantization, s.parallelism, s.limits, s.serving
    engine = build.runtime.sharded  # the engine runtimes: quantized, sharded over tp x pp GPUs
    sm = target.sm
    problems: list[Problem] = []

    # Runtime availability: the target profile lists the runtimes that run there (configs/targets/*.yaml).
    if s.runtime not in target.runtimes:
        ok = fix_choices.runtimes(build, target, arch=arch)
        problems.append(Problem(where("runtime"), s.runtime, f"runtime '{s.runtime}' cannot run on target "
                                f"'{target.name}' (it supports {list(target.runtimes)})",
                                (f"use runtime: {' | '.join(ok)} on '{target.name}', or " if ok else "")
                                + "pick a target that runs it", code="runtime_target"))

    # GPUs: world size = tp x pp ranks, one per GPU (the backend's launch_triton_server.py starts one
    # tritonserver rank per GPU). Only engine runtimes shard over GPUs.
    gpn = par.gpus_per_node or target.gpus_per_node
    if par.gpus_per_node is not None and par.gpus_per_node > target.gpus_per_node:
        problems.append(Problem(where("parallelism.gpus_per_node"), par.gpus_per_node,
                                f"target '{target.name}' has {target.gpus_per_node} GPUs per node",
                                f"set parallelism.gpus_per_node <= {target.gpus_per_node} or remove it",
                                code="gpus_per_node_target"))
    if engine and target.kind == "gpu" and par.world_size > gpn * par.num_nodes:
        problems.append(Problem(where("parallelism.tp_size"), par.tp_size,
                                f"tp_size x pp_size = {par.tp_size} x {par.pp_size} = {par.world_size} ranks need "
                                f"{par.world_size} GPUs, but gpus_per_node x num_nodes = {gpn} x {par.num_nodes} = "
                                f"{gpn * par.num_nodes}", f"lower tp_size/pp_size or set parallelism.num_nodes >= "
                                f"{-(-par.world_size // gpn)}", code="world_size"))

    # Limits (TensorRT-LLM BuildConfig: max_seq_len holds the prompt and at least one generated token).
    if lim.max_seq_len < lim.max_input_len + 1:
        problems.append(Problem(where("limits.max_seq_len"), lim.max_seq_len,
                                f"max_seq_len must be at least max_input_len + 1 = {lim.max_input_len + 1} "
                                "(room for one generated token)",
                                f"set limits.max_seq_len >= {lim.max_input_len + 1}", code="seq_len_vs_input"))
    # Without chunked context a whole prompt is one context chunk, and one forward pass holds at
    # most max_num_tokens tokens: the executor refuses max_input_len > max_num_tokens unless
    # chunked context is on (TensorRT-LLM docs, "Tuning Max Batch Size and Max Num Tokens" and
    # "Long Sequences / Chunked Context": chunking decouples the prompt length from max_num_tokens).
    if not sv.enable_chunked_context and lim.max_num_tokens < lim.max_input_len:
        problems.append(Problem(where("limits.max_num_tokens"), lim.max_num_tokens,
                                f"max_num_tokens must be >= max_input_len ({lim.max_input_len}) when "
                                "enable_chunked_context is off: a whole prompt must fit in one forward pass",
                                f"set limits.max_num_tokens >= {lim.max_input_len} or "
                                "serving.enable_chunked_context: true", code="num_tokens_vs_input"))
    # "if chunked context is enabled, please set the max_num_tokens to be an integer multiple of
    # the kv-cache block size tokens_per_block" (TensorRT-LLM docs/source/features/long-sequence.md).
    if sv.enable_chunked_context and lim.max_num_tokens % lim.tokens_per_block:
        good = lim.max_num_tokens - lim.max_num_tokens % lim.tokens_per_block or lim.tokens_per_block
        problems.append(Problem(where("limits.max_num_tokens"), lim.max_num_tokens,
                                f"with chunked context max_num_tokens must be a multiple of tokens_per_block "
                                f"({lim.tokens_per_block})", f"set limits.max_num_tokens to {good}",
                                code="chunk_block_multiple"))

    # Triton: the tensorrt_llm model's max_batch_size may not exceed the engine's (here the planned one; the
    # repository generator checks the built one), and streaming needs the decoupled policy.
    problems += [Problem(where(p.field), p.value, p.rule, p.fix, p.code)
                 for p in triton_batch_problems(build, lim.max_batch_size)]
    if sv.decoupled is False and sv.streaming:
        problems.append(Problem(where("serving.decoupled"), False, "streaming needs the decoupled transaction policy "
                                "(model_transaction_policy { decoupled: true })",
                                "remove serving.decoupled or set it to true" + ("" if build.runtime.decoupled_only
                                                                                 else " (or set serving.streaming: false)"),
                                code="streaming_decoupled"))
    # The portable runtime's tensorrt_llm model answers through decoupled response senders only
    # (model_repo/templates/tensorrt_llm_pytorch/1/model.py refuses every request without them; README "Interface").
    if build.runtime.decoupled_only and not build.decoupled:
        key = "serving.decoupled" if sv.decoupled is not None else "serving.streaming"
        others = [n for n, r in RUNTIMES.items() if not r.decoupled_only and n in target.runtimes]
        problems.append(Problem(where(key), getattr(sv, key.split(".")[1]), f"the {s.runtime} runtime serves "
                                "decoupled (streaming) transactions only, and this turns the decoupled policy off",
                                "set serving.streaming: true and leave serving.decoupled null (a client still gets "
                                "one answer from HTTP generate)" + (f", or use runtime {' / '.join(others)}"
                                                                    if others else ""),
                                code="pytorch_needs_decoupled"))

    # SM gates (plugins.resolve.hardware_problems, the resolver's own). The portable runtime dequantizes, so
    # only the FP8-context-FMHA choice is judged for it, by the quantization alone.
    problems += hardware_problems(build.recipe, q.kv_cache_quant_algo, sm if engine else None,
                                  use_fp8_context_fmha=q.use_fp8_context_fmha,
                                  trtllm_build=build.runtime.builds_trt_engine, where=where,
                                  runtimes=tuple(fix_choices.runtimes(build, target,
                                                                      lambda rt: not rt.builds_trt_engine, arch)),
                                  quants=tuple(fix_choices.quants(build, target, arch)))
    if build.runtime.builds_trt_engine and sm is not None:  # trtllm-build's own rules (the LLM API builds none)
        problems += _resolver_refusals(build, sm)

    # The LLM-API options (trtllm-llmapi): every key, generated or the spec's serving.llm_api_options, must be one
    # each supported TensorRT-LLM release takes (plugins/llmapi_args.py, from tensorrt_llm/llmapi/llm_args.py).
    if build.runtime.llm_api:
        problems += [Problem(where(p.field), p.value, p.rule, p.fix, p.code)
                     for r in RELEASES for p in option_problems(llm_api_options(build, release=r), releases=[r])]
    problems += llmapi_feature_problems(build, target, arch)
    problems += context_logits_problems(build)
    # LLM-API keys the spec owns elsewhere: one switch each, the spec's (the build and the plan read it there).
    owned = (("trust_remote_code", "model.trust_remote_code", "whether the checkpoint's own code runs is "
              "model.trust_remote_code, for every load (build, tokenizer models, LLM API) at once",
              "llm_api_trust_remote_code"),
             ("enable_attention_dp", "parallelism.enable_attention_dp", "attention data parallelism decides the "
              "plan's memory and predictions, so it is parallelism.enable_attention_dp", "attention_dp"))
    for key, field, rule, code in owned:
        if key in (sv.llm_api_options or {}):
            problems.append(Problem(where("serving.llm_api_options") + f".{key}", sv.llm_api_options[key], rule,
                                    f"remove serving.llm_api_options.{key} and set {field} in the build file",
                                    code=code))

    # KV-cache reuse and chunked context need an engine built with paged context FMHA
    # (https://nvidia.github.io/TensorRT-LLM/advanced/kv-cache-reuse.html: "KV cache reuse
    # requires the model to be built for paged context attention"). The plugin resolver is the one place
    # that decides the flag: check it agrees.
    said = {p.code for p in problems} & {"fp8_context_fmha_vs_kv_cache", "fp8_kv_paged_context"}
    if build.runtime.builds_trt_engine and (sv.enable_kv_cache_reuse or sv.enable_chunked_context) and not said:
        paged = {d.flag: d.value for d in plugin_decisions(build, sm)}.get("use_paged_context_fmha")
        if paged != "enable":
            which = "serving.enable_kv_cache_reuse" if sv.enable_kv_cache_reuse else "serving.enable_chunked_context"
            problems.append(Problem(where(which), True,
                                    f"needs an engine with use_paged_context_fmha enabled, but the plugin "
                                    f"resolution gives {paged!r}", "turn the option off, or fix plugins/resolve.py "
                                    "so that it enables use_paged_context_fmha", code="paged_context_fmha"))
    return problems


def triton_batch_problems(build: ResolvedBuild, engine_max_batch_size: int) -> list[Problem]:
    """serving.triton_max_batch_size above the engine's max_batch_size (``engine_max_batch_size``: the planned
    limits.max_batch_size before the build, the built engine's after it). The tensorrt_llm model's max_batch_size
    may not exceed the engine's (TensorRT-LLM backend docs/model_config.md, ``triton_max_batch_size``)."""
    tmbs = build.settings.serving.triton_max_batch_size
    if tmbs is None or tmbs <= engine_max_batch_size:
        return []
    return [Problem("serving.triton_max_batch_size", tmbs, f"exceeds the engine's max_batch_size "
                    f"{engine_max_batch_size}: Triton's may not be larger",
                    "lower it, or raise limits.max_batch_size (and rebuild)", code="triton_batch_vs_engine")]


def context_logits_problems(build: ResolvedBuild) -> list[Problem]:
    """``limits.gather_context_logits`` where it means nothing or upstream refuses it.

    It is a ``trtllm-build`` flag (BuildConfig.gather_context_logits, tests/facts/trtllm_1_2_1/trtllm_build.json):
    a runtime that builds no TensorRT engine has nothing to set it on. Refused there rather than ignored, so a
    build file never carries a setting that does nothing: the portable runtime returns prompt log probabilities
    without it (return_prompt_log_probs recomputes the prompt's logits on request), and the LLM API takes
    return_context_logits per request. With speculative decoding trtllm-build refuses it (max_draft_len > 0:
    trtllm_build.json ``command_line_rejections``) and the BLS does not return context logits
    (tests/facts/trtllm_1_2_1/log_probs.json ``documented_caveats``).
    """
    s, where = build.settings, build.where
    if not s.limits.gather_context_logits:
        return []
    field = where("limits.gather_context_logits")
    if not build.runtime.builds_trt_engine:
        return [Problem(field, True, f"runtime {s.runtime} builds no TensorRT engine, so trtllm-build's "
                        "gather_context_logits means nothing there (the pytorch runtime returns prompt log "
                        "probabilities without it: return_prompt_log_probs)",
                        "remove limits.gather_context_logits, or set it only under the targets whose runtime is "
                        "trtllm (targets.<target>.limits.gather_context_logits: true)",
                        code="context_logits_runtime")]
    if s.serving.speculative_decoding is not None:
        return [Problem(field, True, "trtllm-build refuses gather_context_logits with speculative decoding "
                        "(max_draft_len > 0), and the BLS returns no context logits with it",
                        "remove limits.gather_context_logits or serving.speculative_decoding",
                        code="context_logits_speculative")]
    return []


def llmapi_feature_problems(build: ResolvedBuild, target: TargetProfile,
                            arch: Architecture | None = None) -> list[Problem]:
    """Speculative decoding, guided decoding, attention DP and host KV offload: which runtimes take them, and the
    draft rules.

    Speculative and guided decoding and attention DP are configured through the LLM API (``speculative_config``,
    ``guided_decoding_backend``, ``enable_attention_dp`` of ``tensorrt_llm/llmapi/llm_args.py``): only
    trtllm-llmapi; attention DP needs tp_size > 1. EAGLE-3 and
    draft-target need a draft checkpoint, NGram and MTP take none (``EagleDecodingConfig`` /
    ``DraftTargetDecodingConfig`` require ``speculative_model_dir``: tests/facts/trtllm_1_2_1/llm_args.json). Host KV
    offload exists in TensorRT-LLM's KV cache manager (both TensorRT-LLM runtimes), not in the portable runtime.
    A fix names another runtime only when ``target`` runs it (and builds ``arch``, when given: builders.fix_choices).
    """
    s, where = build.settings, build.where
    sv = s.serving
    spec = sv.speculative_decoding
    llmapi = build.runtime.llm_api
    problems: list[Problem] = []
    if spec and spec.mode and not llmapi:
        ok = fix_choices.runtimes(build, target, lambda rt: rt.llm_api, arch)
        problems.append(Problem(where("serving.speculative_decoding"), spec.mode, f"runtime {s.runtime} does not "
                                "configure it: only trtllm-llmapi passes the LLM API's speculative_config",
                                (f"set runtime: {' | '.join(ok)} for this target, or " if ok else "")
                                + "remove serving.speculative_decoding", code="llmapi_feature"))
    backend, have = sv.guided_decoding_backend, build.runtime.guided_backends
    if backend and backend not in have:
        ok = fix_choices.runtimes(build, target, lambda rt: backend in rt.guided_backends, arch)
        problems.append(Problem(where("serving.guided_decoding_backend"), backend, f"runtime {s.runtime} has "
                                f"{' and '.join(have)} only", f"set serving.guided_decoding_backend: {have[0]}"
                                + (f", or runtime: {' | '.join(ok)} (it has {backend})" if ok else ""),
                                code="guided_backend_runtime"))
    if s.parallelism.enable_attention_dp and not llmapi:
        ok = fix_choices.runtimes(build, target, lambda rt: rt.llm_api, arch)
        problems.append(Problem(where("parallelism.enable_attention_dp"), True, f"runtime {s.runtime} does not "
                                "configure it: only trtllm-llmapi passes the LLM API's enable_attention_dp",
                                (f"set runtime: {' | '.join(ok)} for this target, or " if ok else "")
                                + "remove parallelism.enable_attention_dp", code="attention_dp"))
    elif s.parallelism.enable_attention_dp and s.parallelism.tp_size == 1:
        problems.append(Problem(where("parallelism.enable_attention_dp"), True, "attention DP spreads requests over "
                                "the tp_size ranks, and tp_size is 1", "set parallelism.tp_size above 1, or remove "
                                "parallelism.enable_attention_dp", code="attention_dp"))
    if sv.kv_cache_host_memory_bytes and not build.runtime.host_kv_tier:
        ok = fix_choices.runtimes(build, target, lambda rt: rt.host_kv_tier, arch)
        problems.append(Problem(where("serving.kv_cache_host_memory_bytes"), sv.kv_cache_host_memory_bytes,
                                "the portable runtime has no host tier for KV blocks (TensorRT-LLM's KV cache manager "
                                "has)", "remove it for this target" + (f", or use runtime {' / '.join(ok)}" if ok
                                                                       else ""),
                                code="kv_host_cache_runtime"))
    if spec is not None:
        drafted = spec.mode in ("eagle3", "draft_target")
        if drafted and not spec.draft_model:
            problems.append(Problem(where("serving.speculative_decoding.draft_model"), None,
                                    f"mode {spec.mode} needs a draft checkpoint (speculative_model_dir)",
                                    "set draft_model to the draft's folder or hub id as the GPU host sees it",
                                    code="speculative_draft"))
        if not drafted and (spec.draft_model or spec.draft_hf_config):
            problems.append(Problem(where("serving.speculative_decoding.draft_model"), spec.draft_model or
                                    spec.draft_hf_config, f"mode {spec.mode} takes no draft model (its drafts come "
                                    "from " + ("the text)" if spec.mode == "ngram" else "the model's own MTP layers)"),
                                    "remove draft_model / draft_hf_config, or use mode eagle3 or draft_target",
                                    code="speculative_draft"))
    return problems


def speculative_model_problems(build: ResolvedBuild, hf_config: dict, draft: dict | None) -> list[Problem]:
    """The model's side of speculative decoding: MTP needs MTP layers in the checkpoint (``num_nextn_predict_layers``
    of its config.json, as DeepSeek-V3's; TensorRT-LLM's MTPDecodingConfig reads them from there), and a
    draft-target draft must share the target's vocabulary (its tokens are verified by id)."""
    spec = build.settings.serving.speculative_decoding
    where = build.where
    problems: list[Problem] = []
    if spec is None:
        return problems
    if spec.mode == "mtp" and not hf_config.get("num_nextn_predict_layers"):
        problems.append(Problem(where("serving.speculative_decoding.mode"), "mtp",
                                f"{(hf_config.get('architectures') or ['this model'])[0]} has no MTP layers "
                                "(config.json num_nextn_predict_layers is absent or 0)",
                                "use mode eagle3 with a draft head, draft_target, or ngram", code="speculative_mtp"))
    if spec.mode == "draft_target" and draft is not None and draft.get("vocab_size") != hf_config.get("vocab_size"):
        problems.append(Problem(where("serving.speculative_decoding.draft_model"), spec.draft_model,
                                f"the draft's vocab_size {draft.get('vocab_size')} differs from the model's "
                                f"{hf_config.get('vocab_size')}: draft tokens are verified by id",
                                "pick a draft with the same tokenizer (e.g. a smaller model of the same family)",
                                code="speculative_vocab"))
    return problems


def _resolver_refusals(build: ResolvedBuild, sm: int) -> list[Problem]:
    """What the plugin resolver refuses for this engine build beyond the SM gates (reported above)."""
    try:
        plugin_decisions(build, sm, strict=True)
    except SpecError as exc:
        return [Problem(build.where(p.field), p.value, p.rule, p.fix, p.code) for p in exc.problems
                if p.code not in HARDWARE_CODES]
    return []


def check(build: ResolvedBuild, target: TargetProfile, hf_config: dict | None = None) -> None:
    """Raise SpecError when the spec breaks a rule that needs no model files. With ``hf_config`` (a config.json
    already at hand: nothing is fetched) the model's rules join the same error, so every problem shows at once."""
    if hf_config is not None:  # a pre-quantized source's own quantization is what the rules judge
        from builders.prequant import source_quantization

        try:
            build, _ = source_quantization(build, hf_config)
        except SpecError:
            make_plan(build, target, hf_config)  # raises: these problems and every other one together
            raise
    problems = spec_problems(build, target)
    if problems:
        if hf_config is not None:
            make_plan(build, target, hf_config)  # raises: the spec's problems and the model's together
        raise SpecError(problems, build.spec_path)


def model_problems(build: ResolvedBuild, hf_config: dict, target: TargetProfile | None = None) -> list[Problem]:
    """Rules that need the model's config.json: sharding divisibility and context length (``target``: the
    build's when not given; a fix names only runtimes it runs)."""
    s = build.settings
    where = build.where
    q, par, lim = s.quantization, s.parallelism, s.limits
    tp, pp = par.tp_size, par.pp_size
    m = ModelShape.from_hf_config(hf_config)
    problems: list[Problem] = []
    group = q.group_size if build.recipe.uses_group_size else None
    tp_fix = _tp_fix(m, group)  # one fix for every tp rule: sizes that pass them all

    # Sharding: every sharded dimension must divide (ModelOpt's exporter, modelopt/torch/export/
    # tensorrt_llm_utils.py, splits heads by tp and layers evenly by pp). With attention DP only the experts split.
    tp = par.attention_tp
    if m.num_attention_heads % tp:
        problems.append(Problem(where("parallelism.tp_size"), tp, f"num_attention_heads ({m.num_attention_heads}) must "
                                "be divisible by tp_size", tp_fix, code="heads_tp"))
    kv = m.num_key_value_heads
    # GQA: kv_heads >= tp must split evenly; kv_heads < tp are duplicated, which needs tp % kv == 0
    # (TensorRT-LLM's checkpoint format: when num_key_value_heads < tp, K/V heads are duplicated up to tp).
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        problems.append(Problem(where("parallelism.tp_size"), tp, f"num_key_value_heads ({kv}) must be divisible by "
                                "tp_size, or tp_size by it (KV heads are duplicated when fewer than tp)",
                                tp_fix, code="kv_heads_tp"))
    if m.moe_layers < m.num_hidden_layers and m.intermediate_size % tp:  # the dense MLP layers
        problems.append(Problem(where("parallelism.tp_size"), tp, f"intermediate_size ({m.intermediate_size}) must be "
                                "divisible by tp_size (the MLP is split by columns/rows across ranks)",
                                tp_fix, code="intermediate_tp"))
    problems += moe_problems(build, m)
    if m.num_hidden_layers % pp:
        problems.append(Problem(where("parallelism.pp_size"), pp, f"num_hidden_layers ({m.num_hidden_layers}) must be "
                                "divisible by pp_size (ModelOpt's exporter splits layers evenly)",
                                f"use pp_size in {_divisors(m.num_hidden_layers)}", code="layers_pp"))
    # AWQ: the group size must divide every per-rank input dimension of a quantized linear layer
    # (ModelOpt's INT4 block quantizer groups along the input; 11008 / 4 = 2752 is not a multiple of 128).
    # Column-parallel layers (qkv, gate, up) keep their input (hidden); row-parallel layers split it:
    # o_proj gets heads x head_dim / tp, down_proj gets intermediate / tp (the architecture's linear shards).
    if group is not None:
        moe_tp, moe_ep = par.moe_sizes
        dims = _awq_dims(m, tp, moe_tp, moe_ep)
        bad = {k: v for k, v in dims.items() if v % group}
        if bad:
            ok = [g for g in (32, 64, 128, 256) if all(v % g == 0 for v in dims.values())]
            fits = valid_tp_sizes(m, group)
            problems.append(Problem(where("quantization.group_size"), group,
                                    "group_size must divide every per-rank sharded input dimension; "
                                    + ", ".join(f"{k} = {v}" for k, v in bad.items()) + " is not a multiple",
                                    f"use group_size in {ok}" if ok else
                                    (f"use tp_size in {fits}" if fits else "change tp_size and group_size"),
                                    code="awq_group"))
    # Attention head size: TensorRT-LLM's fused attention kernels are compiled for a fixed set of head sizes.
    if build.runtime.builds_trt_engine and decode_attention_kernel(
            m.head_dim, m.num_attention_heads, kv, lim.max_beam_width) is None:
        ok = fix_choices.runtimes(build, target or get_target(build.target), lambda rt: not rt.builds_trt_engine,
                                  architecture((hf_config.get("architectures") or [None])[0]))
        problems.append(Problem("model.source", m.head_dim, f"no TensorRT-LLM generation attention kernel serves "
                                f"head_dim {m.head_dim} here (masked MHA takes {list(MMHA_HEAD_SIZES)}; XQA multiples "
                                "of 16 up to 256 for grouped-query attention at beam width 1)",
                                f"use runtime: {' or '.join(ok)}" if ok else "pick a model of another head size",
                                code="head_dim"))
    # Context length: RoPE models are trained up to max_position_embeddings; longer needs a
    # rope scaling entry in config.json (rope_type linear/dynamic/yarn/llama3/longrope), and that entry extends
    # the context only so far (builders.plan.rope_context, from transformers 5.24 modeling_rope_utils.py).
    scaled = rope_context(hf_config)
    if scaled is not None and lim.max_seq_len > scaled[0]:
        problems.append(Problem(where("limits.max_seq_len"), lim.max_seq_len,
                                f"above the {scaled[0]} positions the model's rope scaling reaches ({scaled[1]})",
                                f"set limits.max_seq_len <= {scaled[0]}", code="seq_len_context"))
    elif (scaled is None and m.max_position_embeddings and lim.max_seq_len > m.max_position_embeddings
          and m.rope_scaling_type is None):
        problems.append(Problem(where("limits.max_seq_len"), lim.max_seq_len,
                                f"above the model's max_position_embeddings {m.max_position_embeddings} with no "
                                "rope scaling", f"set limits.max_seq_len <= {m.max_position_embeddings}",
                                code="seq_len_context"))
    return problems


def moe_problems(build: ResolvedBuild, m: ModelShape) -> list[Problem]:
    """Expert parallelism: TensorRT-LLM's ``Mapping`` (tensorrt_llm/mapping.py) splits the tp ranks into
    moe_tp_size x moe_ep_size (their product must be tp_size); each expert-parallel rank holds
    num_experts / moe_ep_size whole experts, each split by moe_tp_size on its intermediate dim."""
    par, where = build.settings.parallelism, build.where
    tp = par.tp_size
    problems: list[Problem] = []
    if not m.is_moe:
        if par.enable_attention_dp:
            problems.append(Problem(where("parallelism.enable_attention_dp"), True, f"{m.architecture} is a dense "
                                    "model: attention DP keeps only experts split, and it has none",
                                    "remove parallelism.enable_attention_dp",
                                    code="attention_dp"))
        for key in ("moe_ep_size", "moe_tp_size"):
            if getattr(par, key) not in (None, 1):
                problems.append(Problem(where(f"parallelism.{key}"), getattr(par, key), f"{m.architecture} is a dense "
                                        "model: it has no experts to split", f"remove parallelism.{key}",
                                        code="moe_sizes"))
        return problems
    moe_tp, moe_ep = par.moe_sizes
    group = build.settings.quantization.group_size if build.recipe.uses_group_size else None
    splits = moe_splits(m, tp, group)
    fix = "use (moe_tp_size, moe_ep_size) in " + ", ".join(f"({a}, {b})" for a, b in splits) if splits else \
        f"no expert split of tp_size {tp} fits: {_tp_fix(m, group)}"
    if moe_tp * moe_ep != tp:
        problems.append(Problem(where("parallelism.moe_ep_size"), par.moe_ep_size, f"moe_tp_size x moe_ep_size = "
                                f"{moe_tp} x {moe_ep} must equal tp_size {tp} (TensorRT-LLM's Mapping splits the tp "
                                "ranks between them)", fix, code="moe_sizes"))
        return problems
    if m.num_experts % moe_ep:
        problems.append(Problem(where("parallelism.moe_ep_size"), moe_ep, f"num_experts ({m.num_experts}) must be "
                                "divisible by moe_ep_size (each expert-parallel rank holds whole experts)", fix,
                                code="experts_ep"))
    if m.moe_intermediate_size % moe_tp:
        problems.append(Problem(where("parallelism.moe_tp_size"), moe_tp, f"the experts' intermediate size "
                                f"({m.moe_intermediate_size}) must be divisible by moe_tp_size", fix,
                                code="expert_intermediate_tp"))
    if m.shared_expert_intermediate_size % par.attention_tp:
        problems.append(Problem(where("parallelism.tp_size"), tp, f"shared_expert_intermediate_size "
                                f"({m.shared_expert_intermediate_size}) must be divisible by tp_size",
                                _tp_fix(m, group), code="intermediate_tp"))
    return problems


def valid_tp_sizes(m: ModelShape, group_size: int | None = None) -> list[int]:
    """tp sizes that pass every tp rule of ``m`` at once (:func:`_tp_fits`): heads, KV heads, the dense MLP,
    the shared expert and some expert split; with ``group_size``, the AWQ group rule too. The vocabulary
    sets no rule: it is padded to a multiple of tp (builders.plan)."""
    return [d for d in _divisors(m.num_attention_heads) if _tp_fits(m, d, group_size)]


def memory_problems(build: ResolvedBuild, target: TargetProfile, plan: Plan) -> list[Problem]:
    """Memory rules on the plan (TensorRT-LLM "Memory Usage of TensorRT-LLM"): weights + activations fit
    the device, and the KV pool holds at least one max_seq_len sequence."""
    where = build.where
    s = build.settings
    mem, kv = plan.memory, plan.memory.kv
    problems: list[Problem] = []
    dev = human_bytes(mem.device_bytes)
    if mem.reserve_bytes + mem.weights_bytes_per_rank > mem.device_bytes:
        problems.append(Problem(where("quantization.quant_algo"), s.quantization.quant_algo,
                                f"weights take {human_bytes(mem.weights_bytes_per_rank)} per rank (+ "
                                f"{human_bytes(mem.reserve_bytes)} runtime reserve), more than the {dev} of "
                                f"'{target.name}'", _weights_fix(build, target, plan), code="weights_fit"))
    elif mem.free_bytes_after_weights_and_activations <= 0:
        problems.append(Problem(where("limits.max_num_tokens"), s.limits.max_num_tokens,
                                f"weights {human_bytes(mem.weights_bytes_per_rank)} + activations "
                                f"{human_bytes(mem.activation_bytes)} + reserve {human_bytes(mem.reserve_bytes)} "
                                f"exceed the {dev} of '{target.name}'", "lower limits.max_num_tokens or "
                                "limits.max_batch_size" + (", or raise tp_size" if build.runtime.sharded else ""),
                                code="activations_fit"))
    elif target.kind == "cpu" and mem.total_bytes > mem.device_bytes:
        problems.append(Problem(where("limits.max_batch_size"), s.limits.max_batch_size,
                                f"weights + activations + KV ({human_bytes(mem.total_bytes)}) exceed the {dev} "
                                f"budget of '{target.name}'", "lower limits.max_batch_size or limits.max_seq_len, "
                                "or set serving.max_tokens_in_paged_kv_cache", code="memory_fit"))
    elif kv.max_seq_len_sequences < 1:
        capped = "max_tokens_in_paged_kv_cache" in kv.pool_source
        field = "serving.max_tokens_in_paged_kv_cache" if capped else "serving.kv_cache_free_gpu_mem_fraction"
        value = s.serving.max_tokens_in_paged_kv_cache if capped else s.serving.kv_cache_free_gpu_mem_fraction
        need = kv.blocks_per_max_seq * kv.tokens_per_block
        raise_it = capped or fix_choices.can_raise(ServingConfig, "kv_cache_free_gpu_mem_fraction", value)
        # each choice checked (builders.fix_choices): a fraction at its bound (1.0) is not raised, the memory
        # around the pool is freed instead; an FP8 KV cache only where the target and the runtime keep one
        room = ([f"allow >= {need} tokens ({human_bytes(need * kv.bytes_per_token)})"] if raise_it else
                ["free memory for it (lower limits.max_num_tokens"
                 + (", raise parallelism.tp_size/pp_size)" if build.runtime.sharded else ")")])
        fixes = room + ["lower limits.max_seq_len"] + (["use an FP8 KV cache (kv_cache_quant_algo: fp8)"]
                                                       if fix_choices.fp8_kv_possible(build, target) else [])
        problems.append(Problem(where(field), value,
                                f"the KV pool holds {kv.capacity_tokens} tokens ({kv.blocks} blocks), less than one "
                                f"max_seq_len sequence ({need} tokens)",
                                ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1],
                                code="kv_pool_one_seq"))
    ctx = mem.context_logits_bytes
    left = mem.free_bytes_after_weights_and_activations - kv.pool_bytes
    if ctx and target.kind == "gpu" and mem.free_bytes_after_weights_and_activations > 0 and ctx > left:
        # builders.plan.context_logits_bytes: allocated at the first context step, in what the KV pool leaves
        fits = int(100 * (1 - ctx / mem.free_bytes_after_weights_and_activations)) / 100
        field = "serving.kv_cache_free_gpu_mem_fraction"
        problems.append(Problem(where(field), s.serving.kv_cache_free_gpu_mem_fraction,
                                f"with limits.gather_context_logits the context-logits buffer (max_num_tokens "
                                f"{s.limits.max_num_tokens} x vocab x 4 B = {human_bytes(ctx)}) must fit in the memory "
                                f"the KV pool leaves ({human_bytes(left)}): TensorRT-LLM allocates it after the pool",
                                (f"set serving.kv_cache_free_gpu_mem_fraction <= {fits}, " if fits > 0 else "")
                                + "lower limits.max_num_tokens, or set limits.gather_context_logits: false",
                                code="context_logits_fit"))
    return problems


def _weights_fix(build: ResolvedBuild, target: TargetProfile, plan: Plan) -> str:
    """The weights_fit fix, each choice checked (builders.fix_choices): more tp/pp ranks and a lighter quantization
    only shrink the weights on an engine runtime (the portable runtime holds the whole dequantized model on one
    device: there, an engine runtime the target runs is the choice)."""
    arch = architecture(plan.model.architecture)
    fixes = []
    if build.runtime.sharded:
        fixes.append("raise parallelism.tp_size/pp_size")
        lighter = fix_choices.quants(build, target, arch, lighter=True)
        if lighter:
            fixes.append(f"quantize (quant_algo {' | '.join(lighter)})")
    else:
        engines = fix_choices.runtimes(build, target, lambda rt: rt.sharded, arch)
        if engines:
            fixes.append(f"use runtime {' | '.join(engines)} (its weights stay quantized and split over tp_size x "
                         "pp_size GPUs)")
    fixes.append("pick a target with more memory")
    return ", ".join(fixes[:-1]) + (", or " if len(fixes) > 1 else "") + fixes[-1]


def architecture_problems(build: ResolvedBuild, hf_config: dict, where: str,
                          target: TargetProfile | None = None) -> list[Problem]:
    """What config.json's family rules out before any weight is read: an architecture the pipeline does not
    know, a config field our rules do not know (a rope type), and a runtime or quantization that cannot build
    this family (plugins.architectures.support, with the runtimes that can)."""
    archs = hf_config.get("architectures") or []
    arch = architecture(archs[0] if archs else None)
    if arch is None:
        return [Problem("model.source", where, f"config.json architecture {archs[0]} is not supported (the pipeline "
                        f"builds: {', '.join(ARCHITECTURES)})", "use a checkpoint of one of these families, or add "
                        "the family to plugins/architectures.py (README: Extending)", code="architecture")]
    problems: list[Problem] = []
    shape = ModelShape.from_hf_config(hf_config)
    unknown = [t for t in shape.rope_types if t not in ROPE_TYPES]
    if unknown:
        problems.append(Problem("model.source", where, f"config.json rope type {unknown[0]!r} is not one the pipeline "
                                f"knows ({', '.join(ROPE_TYPES)})", "use a checkpoint with a known rope_scaling "
                                "type, or add it to plugins/architectures.py ROPE_TYPES with its TensorRT-LLM "
                                "equivalent", code="rope_type"))
    else:
        odd = [t for t in shape.rope_types if t not in arch.rope_types]
        if odd:
            problems.append(Problem("model.source", where, f"{arch.family} checkpoints use rope types "
                                    f"{list(arch.rope_types)}; this config.json names {odd[0]!r}", "check the "
                                    "checkpoint, or add the type to its entry in plugins/architectures.py",
                                    code="rope_type"))
    problems += support_problems(build, arch, target)
    return problems


def remote_code_problems(build: ResolvedBuild, hf_config: dict) -> list[Problem]:
    """A checkpoint that needs Python code of its own to load (an ``auto_map`` entry in config.json or
    tokenizer_config.json that no class of transformers' own stands in for: builders.plan.source_code) is refused
    while ``model.trust_remote_code`` is false, before any stage: every load of it would fail (transformers refuses
    the code, ``dynamic_module_utils.resolve_trust_remote_code``). Code that transformers' own classes replace
    (Phi-3's modeling_phi3.py) does not run and is not refused: the plan says so (compute_plan's warnings)."""
    needed = [c.entry for c in source_code(build, hf_config) if c.library_class is None]
    if build.model.trust_remote_code or not needed:
        return []
    where = str(hf_config.get("_name_or_path") or build.model.source)
    return [Problem("model.trust_remote_code", False, f"the checkpoint {where} needs Python code of its own to load "
                    f"({'; '.join(needed)}: transformers has no class of its own for it), which transformers would "
                    "import and run, and model.trust_remote_code is false (the default: no checkpoint code runs)",
                    "read that code; if you trust it, set `model.trust_remote_code: true` in the build file, else "
                    "use a checkpoint without it", code="remote_code")]


def support_problems(build: ResolvedBuild, arch: Architecture, target: TargetProfile | None = None) -> list[Problem]:
    """A Problem when ``build``'s runtime or quantization cannot build ``arch``, naming what can on ``target``
    (default: the build's): quantizations its SM runs with this runtime, runtimes the target runs
    (builders.fix_choices)."""
    s, where = build.settings, build.where
    verdict = support(arch, build.runtime, build.recipe)
    if verdict.ok:
        return []
    target = target or get_target(build.target)
    quants = fix_choices.quants(build, target, arch)
    if any(support(arch, build.runtime, r).ok for r in QUANT_RECIPES.values()):
        # this runtime builds the family, just not with this quantization
        runtimes = [] if quants else fix_choices.runtimes(build, target, arch=arch)
        fix = (f"use quant_algo: {' | '.join(quants)}" if quants else
               f"no quantization this runtime builds {arch.family} with runs on '{target.name}': use runtime: "
               f"{' | '.join(runtimes)}" if runtimes else f"pick another target for {arch.family}")
        return [Problem(where("quantization.quant_algo"), s.quantization.quant_algo, f"{arch.family} with runtime "
                        f"{s.runtime}: {verdict.reason}", fix, code="family_quant")]
    instead = [n for n in verdict.instead if fix_choices.runtime_passes(build, target, n, arch)]
    fix = (f"use runtime: {' or '.join(instead)}" if instead else "no runtime builds it with this "
           f"quantization on '{target.name}'; change quantization.quant_algo")
    return [Problem(where("runtime"), s.runtime, f"runtime {s.runtime} cannot build {arch.family} ({arch.name}): "
                    f"{verdict.reason}", fix, code="family_runtime")]


def _arch_of(hf_config: dict) -> Architecture | None:
    archs = hf_config.get("architectures") or []
    return architecture(archs[0] if archs else None)


def make_plan(build: ResolvedBuild, target: TargetProfile, hf_config: dict, *, isl: int = 128, osl: int = 128,
              spec_checked: bool = False, hf_dir: Path | None = None) -> Plan:
    """Check every rule (spec, model, memory) and return the build's plan, computed once.

    Args:
        build, target: the resolved spec and its hardware profile.
        hf_config: the model's config.json as a dict.
        isl, osl: the workload shape whose concurrency the plan reports (tokens).
        spec_checked: :func:`check` already ran (its rules are not run again).
        hf_dir: the model folder, when the build is about to read its weights: its safetensors headers are checked
            against what config.json implies (builders.source_tensors.checkpoint_problems: a missing, unexpected
            or mis-shaped tensor, a shard the index names but the folder lacks), no weight read.

    Raises:
        SpecError: every problem at once.
    """
    from builders.prequant import adopt, detect, runtime_problems, source_quantization

    try:  # a pre-quantized source: the build takes its quantization (or disagrees with it)
        build, pq = source_quantization(build, hf_config, hf_dir)
        problems = []
    except SpecError as exc:  # reported; the other rules judge the checkpoint's own quantization
        problems = list(exc.problems)
        pq = detect(hf_config, hf_dir) if not any(p.code == "prequant_format" for p in problems) else None
        if pq is not None:
            build = adopt(build, pq)
    problems += [] if spec_checked else spec_problems(build, target, _arch_of(hf_config))
    problems += runtime_problems(build, pq, hf_config)
    problems += remote_code_problems(build, hf_config)
    problems += architecture_problems(build, hf_config, str(hf_config.get("_name_or_path", "config.json")), target)
    if not any(p.code == "architecture" for p in problems):  # the shape rules assume a known family
        problems += model_problems(build, hf_config, target)
    if hf_dir is not None and not any(p.code in ("architecture", "remote_code") for p in problems):
        from builders.source_tensors import checkpoint_problems

        problems += checkpoint_problems(hf_dir, trust_remote_code=build.model.trust_remote_code, prequantized=pq)
    draft, draft_source = draft_config(build)
    problems += speculative_model_problems(build, hf_config, draft)
    adapters: list = []
    if build.settings.lora.adapters and not any(p.code == "architecture" for p in problems):
        from builders.lora import lora_problems, read_adapters

        adapters, read = read_adapters(build.settings.lora.adapters, build.where("lora.adapters"))
        problems += read + lora_problems(build, hf_config, adapters)
    plan = None
    if not any(p.code in SHARDING_CODES + ("architecture", "rope_type") for p in problems):
        plan = compute_plan(build, target, hf_config, isl=isl, osl=osl, draft=draft, draft_source=draft_source,
                            source_quantization=pq,
                            adapters=adapters)
        problems += memory_problems(build, target, plan)
    if problems:
        raise SpecError(problems, build.spec_path)
    return plan


def check_model(build: ResolvedBuild, target: TargetProfile, hf_dir: Path) -> Plan:
    """The plan of ``build`` for the model in ``hf_dir`` (the spec-only rules already checked); raise
    SpecError when the spec does not fit that model on ``target``."""
    return make_plan(build, target, read_hf_config(hf_dir), spec_checked=True)
