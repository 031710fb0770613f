"""Upstream's Triton LLM-API model (TensorRT-LLM ``triton_backend/all_models/llmapi``): its ``config.pbtxt``, as data.

A trtllm-llmapi build's ``deploy/llmapi/`` is that model's folder layout: ``tensorrt_llm/config.pbtxt`` written
from :data:`CONFIG` by :func:`config_pbtxt`, and ``tensorrt_llm/1/model.yaml`` (model_repo.deploy: the build's
LLM-API options with ``model``, ``backend`` and ``triton_config``). Only upstream's Python code,
``tensorrt_llm/1/model.py`` and ``helpers.py``, is copied from a TensorRT-LLM checkout of the serving version.

Values from ``triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt`` of NVIDIA/TensorRT-LLM at
c8c6df08bd0ead54cd47f7973e1e425c28a174cd (the 1.2.x version read for 1.2.1; the newer main adds LoRA and image
inputs after the 26.07 container's pin), recorded in tests/facts/trtllm_1_2_1/triton_llmapi_model.json
(``config_pbtxt``), which ``tests/model_repo/test_deploy.py`` compares this file with.

As upstream, the file sets neither ``max_batch_size`` nor ``model_transaction_policy``: ``model.py``'s
``auto_complete_config`` sets both from ``model.yaml``'s ``triton_config`` (``max_batch_size``, ``decoupled``)
when Triton loads the model. Triton calls it only when started without ``--disable-auto-complete-config``, which
upstream's ``scripts/launch_triton_server.py`` passes: with that script the model stays at ``max_batch_size`` 0
and not decoupled whatever ``model.yaml`` says.
"""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

SOURCE = ("NVIDIA/TensorRT-LLM@c8c6df08bd0ead54cd47f7973e1e425c28a174cd "
          "triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt")
"""Where :data:`CONFIG` comes from."""

_OPTIONAL_INPUTS: tuple[tuple[str, str, int], ...] = (
    ("streaming", "TYPE_BOOL", 1),
    # SamplingParams arguments of each request
    ("sampling_param_best_of", "TYPE_INT32", 1),
    ("sampling_param_temperature", "TYPE_FP32", 1),
    ("sampling_param_top_k", "TYPE_INT32", 1),
    ("sampling_param_top_p", "TYPE_FP32", 1),
    ("sampling_param_frequency_penalty", "TYPE_FP32", 1),
    ("sampling_param_presence_penalty", "TYPE_FP32", 1),
    ("sampling_param_max_tokens", "TYPE_INT32", 1),
    ("sampling_param_stop", "TYPE_STRING", -1),
    ("sampling_param_seed", "TYPE_UINT64", 1),
    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", 1),
    ("sampling_param_return_perf_metrics", "TYPE_BOOL", 1),
    # which response fields to return
    ("return_finish_reason", "TYPE_BOOL", 1),
    ("return_stop_reason", "TYPE_BOOL", 1),
    ("return_cumulative_logprob", "TYPE_BOOL", 1),
    ("stop", "TYPE_BOOL", 1),
)

_OUTPUTS: tuple[tuple[str, str, int], ...] = (  # fields of the LLM API's RequestOutput
    ("text_output", "TYPE_STRING", -1),
    ("finish_reason", "TYPE_STRING", -1),
    ("stop_reason", "TYPE_STRING", -1),
    ("cumulative_logprob", "TYPE_FP32", -1),
    ("kv_cache_reused_block", "TYPE_INT32", -1),
    ("kv_cache_missed_block", "TYPE_INT32", -1),
    ("kv_cache_alloc_new_blocks", "TYPE_INT32", -1),
    ("kv_cache_alloc_total_blocks", "TYPE_INT32", -1),
    ("kv_cache_hit_rate", "TYPE_FP32", -1),
    ("arrival_time_ns", "TYPE_INT64", 1),
    ("first_scheduled_time_ns", "TYPE_INT64", 1),
    ("first_token_time_ns", "TYPE_INT64", 1),
    ("last_token_time_ns", "TYPE_INT64", 1),
    ("acceptance_rate", "TYPE_FP32", 1),
    ("total_accepted_draft_tokens", "TYPE_INT32", 1),
    ("total_draft_tokens", "TYPE_INT32", 1),
)

CONFIG: dict = {
    "name": "tensorrt_llm",
    "backend": "python",
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1]}]
    + [{"name": n, "data_type": t, "dims": [d], "optional": True} for n, t, d in _OPTIONAL_INPUTS],
    "output": [{"name": n, "data_type": t, "dims": [d]} for n, t, d in _OUTPUTS],
}
"""Upstream's ``config.pbtxt`` as Triton ``ModelConfig`` fields (no ``parameters``, no ``max_batch_size``, no
``model_transaction_policy``: see the module docstring)."""


def model_config() -> model_config_pb2.ModelConfig:
    """:data:`CONFIG` as Triton's ``ModelConfig`` proto (raises ``google.protobuf.json_format.ParseError`` only if
    the constant itself is malformed)."""
    from google.protobuf import json_format

    return json_format.ParseDict(CONFIG, model_config_pb2.ModelConfig())


def config_pbtxt() -> str:
    """The text of ``llmapi/tensorrt_llm/config.pbtxt``: a header naming the source, then :data:`CONFIG` in Triton's
    text format."""
    return (f"# Upstream's Triton LLM-API model config ({SOURCE}), written by trtpipe.\n"
            "# max_batch_size and model_transaction_policy (decoupled) are not set here, as upstream: model.py's\n"
            "# auto_complete_config takes them from 1/model.yaml triton_config. Start tritonserver without\n"
            "# --disable-auto-complete-config (upstream's launch_triton_server.py passes it) or they stay 0 / false.\n"
            + text_format.MessageToString(model_config()))
