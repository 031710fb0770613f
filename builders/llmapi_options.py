"""The LLM-API options YAML of a build: what ``trtllm-serve --extra_llm_api_options`` and upstream's Triton
LLM-API model (``model.yaml``) pass to ``tensorrt_llm.LLM`` for the PyTorch backend.

:func:`llm_api_options` derives it from the spec and the plan (parallel sizes, the limits, the KV cache,
chunked prefill, the scheduler, CUDA-graph batch sizes); :func:`option_problems` checks every key against the
argument classes of each TensorRT-LLM release the path supports (:data:`plugins.llmapi_args.LLM_API_ARGS`,
recorded from ``tensorrt_llm/llmapi/llm_args.py``), so a misspelt key or one a release lacks or refuses is an
error naming the release.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from builders.plan import Plan
from builders.spec import ResolvedBuild
from plugins.errors import Problem, did_you_mean
from plugins.llmapi_args import LLM_API_ARGS
from trtpipe_runtime.versions import OPTIONS_FILE, options_file_name

SPECULATIVE: dict[str, dict[str, tuple[str, Optional[str]]]] = {
    "eagle3": {"1.2.1": ("Eagle", "speculative_model_dir"), "1.4": ("Eagle3", "speculative_model")},
    "draft_target": {"1.2.1": ("DraftTarget", "speculative_model_dir"), "1.4": ("Draft_Target", "speculative_model")},
    "ngram": {"1.2.1": ("NGram", None), "1.4": ("NGram", None)},
    "mtp": {"1.2.1": ("MTP", None), "1.4": ("MTP", None)},
}
"""serving.speculative_decoding.mode -> release -> (``decoding_type``, the draft checkpoint's key). 1.2.1 dispatches
``DecodingBaseConfig.from_dict`` on ``Eagle`` (EAGLE-3 on the PyTorch backend, ``eagle3_one_model`` default true) and
``DraftTarget``; 1.4's discriminated union names ``Eagle3`` and ``Draft_Target`` and renames ``speculative_model_dir``
to ``speculative_model`` (tests/facts/trtllm_1_2_1/llm_args.json, tests/facts/trtllm_1_4/llm_args.json
``speculative``)."""

RELEASES = tuple(LLM_API_ARGS)
"""The releases an options file is written for, oldest (the pinned container's) first."""

SCHEDULER_POLICY = {"max_utilization": "MAX_UTILIZATION", "guaranteed_no_evict": "GUARANTEED_NO_EVICT"}
"""serving.batch_scheduler_policy -> ``SchedulerConfig.capacity_scheduler_policy`` (CapacitySchedulerPolicy)."""


def cuda_graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to max_batch_size, and max_batch_size itself (the sizes CUDA graphs are captured for)."""
    sizes, n = [], 1
    while n < max_batch_size:
        sizes.append(n)
        n *= 2
    return sizes + [max_batch_size]


def speculative_config(spec, release: str) -> dict[str, Any]:
    """``speculative_config`` of ``serving.speculative_decoding`` spelt for ``release`` (see :data:`SPECULATIVE`)."""
    decoding_type, draft_key = SPECULATIVE[spec.mode][release]
    out: dict[str, Any] = {"decoding_type": decoding_type}
    if spec.mode == "mtp" and release == "1.2.1":  # 1.2.1 sets max_draft_len from num_nextn_predict_layers
        out["num_nextn_predict_layers"] = spec.max_draft_len
    else:
        out["max_draft_len"] = spec.max_draft_len
    if draft_key and spec.draft_model:
        out[draft_key] = spec.draft_model
    if spec.mode == "ngram":
        out["max_matching_ngram_size"] = spec.max_matching_ngram_size
    if spec.max_concurrency:
        out["max_concurrency"] = spec.max_concurrency
    return out


def lora_config(build: ResolvedBuild, plan: Optional[Plan] = None,
                engine_dir: Optional[Path] = None) -> Optional[dict[str, Any]]:
    """``lora_config`` of ``lora.adapters`` (None without adapters): the LLM API's ``LoraConfig`` fields, the same
    names and meaning in 1.2.1 and 1.4 (tests/facts/trtllm_*/lora_llmapi.json ``lora_config``).

    ``max_lora_rank`` (the plan's, else the spec's; TensorRT-LLM's default 64 otherwise), ``max_loras`` /
    ``max_cpu_loras`` (the GPU and host cache slots), ``lora_target_modules`` in TensorRT-LLM's names (without them
    and without ``lora_dir`` 1.2.1 expects every module, at a large memory cost), and ``lora_dir``: the adapters'
    folders in the engine folder (builders.lora.write_adapters), absolute as the deployment mounts the build folder at the
    same path, when ``engine_dir`` is known. LoRA is on because ``lora_config`` is set: the PyTorch backend ignores
    ``enable_lora`` when it is (1.2.1 ``validate_lora_config_consistency``), so it is not written.
    """
    lo = build.settings.lora
    if not lo.adapters:
        return None
    out: dict[str, Any] = {}
    if plan is not None and plan.lora is not None:
        rank, modules = plan.lora.max_lora_rank, list(plan.lora.trtllm_modules)
    else:  # no plan (deployment files, spec checks): the adapters' headers, as the plan reads them
        from builders.lora import HF_TO_TRTLLM, max_rank, read_adapters

        adapters, _ = read_adapters(lo.adapters)
        rank = max_rank(lo, adapters)
        modules = [HF_TO_TRTLLM[m] for m in sorted({m for a in adapters for m in a.target_modules})]  # as lora_plan
    if rank:
        out["max_lora_rank"] = rank
    out.update(max_loras=lo.max_loras, max_cpu_loras=lo.max_cpu_loras)
    if modules:
        out["lora_target_modules"] = modules
    if engine_dir is not None:
        from builders.lora import adapter_dir

        out["lora_dir"] = [str(adapter_dir(Path(engine_dir).resolve(), name)) for name in lo.adapters]
    return out


def llm_api_options(build: ResolvedBuild, plan: Optional[Plan] = None, release: str = RELEASES[0],
                    engine_dir: Optional[Path] = None) -> dict[str, Any]:
    """The options for ``tensorrt_llm.LLM`` (PyTorch backend) of ``build`` as planned, for TensorRT-LLM ``release``
    (a key of :data:`plugins.llmapi_args.LLM_API_ARGS`): a dict for YAML.

    Keys are ``TorchLlmArgs`` fields (TensorRT-LLM ``llmapi/llm_args.py``); nested dicts are ``KvCacheConfig``,
    ``SchedulerConfig``, ``CudaGraphConfig``, the ``speculative_config`` of :func:`speculative_config` (the one
    part spelt differently per release) and the ``lora_config`` of :func:`lora_config` (``engine_dir``: the engine
    folder its ``lora_dir`` points into). ``serving.llm_api_options`` entries are merged last (the user's word wins),
    then checked by :func:`option_problems`. Without ``plan`` (spec checks) the expert sizes are the spec's when it
    sets them.
    """
    s = build.settings
    lim, sv, q, par = s.limits, s.serving, s.quantization, s.parallelism
    # KV-cache reuse (prefix caching): the spec's word when it says one, else the LLM API's default, on
    # (KvCacheConfig.enable_block_reuse defaults to true in 1.2.1 and 1.4; the C++ backend's default is off).
    reuse = sv.enable_kv_cache_reuse if "enable_kv_cache_reuse" in sv.model_fields_set else True
    kv: dict[str, Any] = {"free_gpu_memory_fraction": sv.kv_cache_free_gpu_mem_fraction,
                          "enable_block_reuse": reuse,
                          "dtype": "fp8" if q.kv_cache_quant_algo == "fp8" else "auto",
                          "tokens_per_block": lim.tokens_per_block}
    if sv.max_tokens_in_paged_kv_cache:
        kv["max_tokens"] = sv.max_tokens_in_paged_kv_cache
    if sv.kv_cache_host_memory_bytes:
        kv["host_cache_size"] = sv.kv_cache_host_memory_bytes
    options: dict[str, Any] = {
        "tensor_parallel_size": par.tp_size, "pipeline_parallel_size": par.pp_size,
        "max_batch_size": lim.max_batch_size, "max_num_tokens": lim.max_num_tokens, "max_seq_len": lim.max_seq_len,
        "max_beam_width": lim.max_beam_width, "enable_chunked_prefill": sv.enable_chunked_context,
        "kv_cache_config": kv,
        "scheduler_config": {"capacity_scheduler_policy": SCHEDULER_POLICY[sv.batch_scheduler_policy]},
        "cuda_graph_config": {"batch_sizes": cuda_graph_batch_sizes(lim.max_batch_size), "enable_padding": True},
        # the build file's model.trust_remote_code, said explicitly (the LLM API loads the tokenizer and model)
        "trust_remote_code": build.model.trust_remote_code,
    }
    if sv.speculative_decoding is not None:
        options["speculative_config"] = speculative_config(sv.speculative_decoding, release)
    if sv.guided_decoding_backend:
        options["guided_decoding_backend"] = sv.guided_decoding_backend
    lora = lora_config(build, plan, engine_dir)
    if lora is not None:
        options["lora_config"] = lora
    if plan is not None and plan.model.is_moe or plan is None and (par.moe_ep_size or par.moe_tp_size):
        moe_tp, moe_ep = (plan.moe_tp_size, plan.moe_ep_size) if plan is not None else par.moe_sizes
        options.update(moe_tensor_parallel_size=moe_tp, moe_expert_parallel_size=moe_ep)
    if par.enable_attention_dp:
        options["enable_attention_dp"] = True
    for key, value in (sv.llm_api_options or {}).items():
        if isinstance(value, dict) and isinstance(options.get(key), dict):
            options[key] = {**options[key], **value}
        else:
            options[key] = value
    return options


def options_by_release(build: ResolvedBuild, plan: Optional[Plan] = None,
                       engine_dir: Optional[Path] = None) -> dict[str, dict[str, Any]]:
    """:func:`llm_api_options` for every release in :data:`RELEASES`, oldest first."""
    return {r: llm_api_options(build, plan, r, engine_dir) for r in RELEASES}


def options_files(build: ResolvedBuild, plan: Optional[Plan] = None,
                  engine_dir: Optional[Path] = None) -> dict[str, str]:
    """``{file name: YAML text}``: ``llm_api_options.yaml`` for the oldest release (the pinned container's) and
    ``llm_api_options-<release>.yaml`` for each later one whose options differ (speculative decoding's spelling)."""
    by_release = options_by_release(build, plan, engine_dir)
    first = by_release[RELEASES[0]]
    files = {OPTIONS_FILE: options_yaml(first, build, [r for r, o in by_release.items() if o == first])}
    for release, options in by_release.items():
        if options != first:
            files[options_file(release)] = options_yaml(options, build, [release])
    return files


def options_file(release: str) -> str:
    """The options file name for ``release``: :data:`OPTIONS_FILE` for the oldest, else with the release in it (the
    names trtpipe_runtime.versions.options_file chooses among)."""
    return OPTIONS_FILE if release == RELEASES[0] else options_file_name(release)


def option_problems(options: dict[str, Any], field: str = "serving.llm_api_options",
                    releases: Optional[list[str]] = None) -> list[Problem]:
    """Every key of ``options`` that a TensorRT-LLM release (``releases``, default every supported one) does not
    accept, naming the release.

    A top-level key must be a ``TorchLlmArgs`` field of each release in :data:`LLM_API_ARGS`; a nested key a field
    of that option's config class (``speculative_config``: of its ``decoding_type``'s class); a key only the TensorRT
    backend takes (``build_config``...) is refused by the PyTorch backend.
    """
    problems: list[Problem] = []
    for version in releases or RELEASES:
        args = LLM_API_ARGS[version]
        spec = options.get("speculative_config")
        if isinstance(spec, dict):
            kind = spec.get("decoding_type")
            if kind not in args.speculative:
                problems.append(Problem(f"{field}.speculative_config.decoding_type", kind, f"TensorRT-LLM {version} "
                                        f"takes decoding_type {' | '.join(sorted(args.speculative))} here",
                                        "use one of them (serving.speculative_decoding.mode writes the right one)."
                                        f"{did_you_mean(str(kind), args.speculative)}", code="llm_api_key"))
            else:
                problems += [Problem(f"{field}.speculative_config.{k}", v, f"TensorRT-LLM {version}'s {kind} "
                                     f"speculative_config has no field '{k}'", "remove it or use a known field."
                                     f"{did_you_mean(k, args.speculative[kind])}", code="llm_api_key")
                             for k, v in spec.items() if k not in args.speculative[kind]]
        backend = options.get("guided_decoding_backend")
        if backend is not None and backend not in args.guided_decoding_backends:
            problems.append(Problem(f"{field}.guided_decoding_backend", backend, f"TensorRT-LLM {version} takes "
                                    f"{' | '.join(sorted(args.guided_decoding_backends))}", "use one of them",
                                    code="llm_api_key"))
        for key, value in options.items():
            if key in args.trt_only:
                problems.append(Problem(f"{field}.{key}", value, f"TensorRT-LLM {version}'s PyTorch backend refuses "
                                        f"'{key}' (a TensorRT-engine option)", f"remove {field}.{key}",
                                        code="llm_api_key"))
            elif key not in args.fields:
                problems.append(Problem(f"{field}.{key}", value, f"TensorRT-LLM {version}'s LLM API has no option "
                                        f"'{key}'", f"remove it or use a known option.{did_you_mean(key, args.fields)}",
                                        code="llm_api_key"))
            elif key == "speculative_config":
                continue  # checked above, by decoding_type
            elif isinstance(value, dict) and key in args.nested:
                for sub, sub_value in value.items():
                    if sub not in args.nested[key]:
                        problems.append(Problem(f"{field}.{key}.{sub}", sub_value, f"TensorRT-LLM {version}'s "
                                                f"{key} has no field '{sub}'", "remove it or use a known field."
                                                f"{did_you_mean(sub, args.nested[key])}", code="llm_api_key"))
    return problems


def options_yaml(options: dict[str, Any], build: ResolvedBuild, releases: Optional[list[str]] = None) -> str:
    """The options as the YAML file ``trtllm-serve --extra_llm_api_options`` (``--config``) reads, with a header
    naming the releases (default every supported one) it was checked against."""
    import yaml

    head = (f"# LLM-API options of build {build.name} for {build.target} (generated by trtpipe from the spec and the "
            "plan).\n# trtllm-serve serve <checkpoint> --config <this file> (alias --extra_llm_api_options); for "
            f"TensorRT-LLM {', '.join(releases or RELEASES)}.\n")
    return head + yaml.safe_dump(options, sort_keys=False)
