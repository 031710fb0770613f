"""The LLM-API options YAML of a build: what ``trtllm-serve --extra_llm_api_options`` and upstream's Triton
LLM-API model (``model.yaml``) pass to ``tensorrt_llm.LLM`` for the PyTorch backend.

:func:`llm_api_options` derives it from the spec and the plan (parallel sizes, the limits, the KV cache,
chunked prefill, the scheduler, CUDA-graph batch sizes); :func:`option_problems` checks every key against the
argument classes of each TensorRT-LLM release the path supports (:data:`plugins.llmapi_args.LLM_API_ARGS`,
recorded from ``tensorrt_llm/llmapi/llm_args.py``), so a misspelt key or one a release lacks or refuses is an
error naming the release.
"""

from __future__ import annotations

from typing import Any, Optional

from builders.plan import Plan
from builders.spec import ResolvedBuild
from plugins.errors import Problem, did_you_mean
from plugins.llmapi_args import LLM_API_ARGS

SCHEDULER_POLICY = {"max_utilization": "MAX_UTILIZATION", "guaranteed_no_evict": "GUARANTEED_NO_EVICT"}
"""serving.batch_scheduler_policy -> ``SchedulerConfig.capacity_scheduler_policy`` (CapacitySchedulerPolicy)."""


def cuda_graph_batch_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to max_batch_size, and max_batch_size itself (the sizes CUDA graphs are captured for)."""
    sizes, n = [], 1
    while n < max_batch_size:
        sizes.append(n)
        n *= 2
    return sizes + [max_batch_size]


def llm_api_options(build: ResolvedBuild, plan: Optional[Plan] = None) -> dict[str, Any]:
    """The options for ``tensorrt_llm.LLM`` (PyTorch backend) of ``build`` as planned: a dict for YAML.

    Keys are ``TorchLlmArgs`` fields (TensorRT-LLM ``llmapi/llm_args.py``); nested dicts are ``KvCacheConfig``,
    ``SchedulerConfig`` and ``CudaGraphConfig``. ``serving.llm_api_options`` entries are merged last (the user's
    word wins), then checked by :func:`option_problems`. Without ``plan`` (spec checks) the expert sizes are the
    spec's when it sets them.
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
    options: dict[str, Any] = {
        "tensor_parallel_size": par.tp_size, "pipeline_parallel_size": par.pp_size,
        "max_batch_size": lim.max_batch_size, "max_num_tokens": lim.max_num_tokens, "max_seq_len": lim.max_seq_len,
        "max_beam_width": lim.max_beam_width, "enable_chunked_prefill": sv.enable_chunked_context,
        "kv_cache_config": kv,
        "scheduler_config": {"capacity_scheduler_policy": SCHEDULER_POLICY[sv.batch_scheduler_policy]},
        "cuda_graph_config": {"batch_sizes": cuda_graph_batch_sizes(lim.max_batch_size), "enable_padding": True},
    }
    if plan is not None and plan.model.is_moe or plan is None and (par.moe_ep_size or par.moe_tp_size):
        moe_tp, moe_ep = (plan.moe_tp_size, plan.moe_ep_size) if plan is not None else par.moe_sizes
        options.update(moe_tensor_parallel_size=moe_tp, moe_expert_parallel_size=moe_ep)
    for key, value in (sv.llm_api_options or {}).items():
        if isinstance(value, dict) and isinstance(options.get(key), dict):
            options[key] = {**options[key], **value}
        else:
            options[key] = value
    return options


def option_problems(options: dict[str, Any], field: str = "serving.llm_api_options") -> list[Problem]:
    """Every key of ``options`` that a supported TensorRT-LLM release does not accept, naming the release.

    A top-level key must be a ``TorchLlmArgs`` field of each release in :data:`LLM_API_ARGS`; a nested key a field
    of that option's config class; a key only the TensorRT backend takes (``build_config``...) is refused by the
    PyTorch backend.
    """
    problems: list[Problem] = []
    for version, args in LLM_API_ARGS.items():
        for key, value in options.items():
            if key in args.trt_only:
                problems.append(Problem(f"{field}.{key}", value, f"TensorRT-LLM {version}'s PyTorch backend refuses "
                                        f"'{key}' (a TensorRT-engine option)", f"remove {field}.{key}",
                                        code="llm_api_key"))
            elif key not in args.fields:
                problems.append(Problem(f"{field}.{key}", value, f"TensorRT-LLM {version}'s LLM API has no option "
                                        f"'{key}'", f"remove it or use a known option.{did_you_mean(key, args.fields)}",
                                        code="llm_api_key"))
            elif isinstance(value, dict) and key in args.nested:
                for sub, sub_value in value.items():
                    if sub not in args.nested[key]:
                        problems.append(Problem(f"{field}.{key}.{sub}", sub_value, f"TensorRT-LLM {version}'s "
                                                f"{key} has no field '{sub}'", "remove it or use a known field."
                                                f"{did_you_mean(sub, args.nested[key])}", code="llm_api_key"))
    return problems


def options_yaml(options: dict[str, Any], build: ResolvedBuild) -> str:
    """The options as the YAML file ``trtllm-serve --extra_llm_api_options`` (``--config``) reads, with a header."""
    import yaml

    head = (f"# LLM-API options of build {build.name} for {build.target} (generated by trtpipe from the spec and the "
            "plan).\n# trtllm-serve serve <checkpoint> --config <this file> (alias --extra_llm_api_options); checked "
            f"against TensorRT-LLM {', '.join(LLM_API_ARGS)}.\n")
    return head + yaml.safe_dump(options, sort_keys=False)
