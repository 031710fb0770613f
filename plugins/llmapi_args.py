"""The LLM API's accepted options per TensorRT-LLM release: the keys ``builders.llmapi_options`` checks an options
YAML against (``TorchLlmArgs`` of ``tensorrt_llm/llmapi/llm_args.py``, the PyTorch backend's ``tensorrt_llm.LLM``
arguments, and the fields of the nested configs the YAML sets).

Recorded from upstream with commits (tests/facts/trtllm_1_2_1/llm_args.json, tests/facts/trtllm_1_4/llm_args.json;
``tests/plugins/test_registries.py`` keeps these sets equal to them). TorchLlmArgs forbids extra keys in both
releases; 1.2.1 still has the TensorRT-backend fields (``trt_only``), which the PyTorch backend refuses; 1.4 has no
TensorRT backend at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LlmApiArgs:
    """What one release's ``tensorrt_llm.LLM`` (PyTorch backend) accepts.

    Attributes:
        source: the upstream commit the sets were read at.
        fields: top-level option names (``TorchLlmArgs`` and its base ``BaseLlmArgs``).
        trt_only: options of the TensorRT backend's ``TrtLlmArgs`` that the PyTorch backend refuses.
        nested: fields of the nested config options (``kv_cache_config``, ``scheduler_config``, ``cuda_graph_config``,
            ``lora_config``: LoraConfig, tests/facts/trtllm_*/lora_llmapi.json).
        speculative: ``speculative_config`` keys per ``decoding_type`` value the release accepts (the
            ``DecodingBaseConfig`` fields, the subclass's own, and ``decoding_type``).
        guided_decoding_backends: the ``guided_decoding_backend`` values.
    """

    source: str
    fields: frozenset[str]
    trt_only: frozenset[str] = field(default=frozenset())
    nested: dict[str, frozenset[str]] = field(default_factory=dict)
    speculative: dict[str, frozenset[str]] = field(default_factory=dict)
    guided_decoding_backends: frozenset[str] = field(default=frozenset())


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _decoding(base: str, **classes: str) -> dict[str, frozenset[str]]:
    return {kind: _names(base) | _names(own) | {"decoding_type"} for kind, own in classes.items()}


LLM_API_ARGS: dict[str, LlmApiArgs] = {
    "1.2.1": LlmApiArgs(
        source="NVIDIA/TensorRT-LLM@c292b9f997d6 tensorrt_llm/llmapi/llm_args.py",
        fields=_names("""
    allreduce_strategy attention_dp_config attn_backend backend batch_wait_max_tokens_ratio
    batch_wait_timeout_iters batch_wait_timeout_ms batched_logits_processor cache_transceiver_config
    checkpoint_format checkpoint_loader context_parallel_size cp_config cuda_graph_config
    decoding_config disable_flashinfer_sampling disable_overlap_scheduler dtype enable_attention_dp
    enable_autotuner enable_chunked_prefill enable_iter_perf_stats enable_iter_req_stats
    enable_layerwise_nvtx_marker enable_lm_head_tp_in_adp enable_lora enable_min_latency
    enable_sleep env_overrides fail_fast_on_attention_window_too_large force_dynamic_quantization
    garbage_collection_gen0_threshold gather_generation_logits gpus_per_node guided_decoding_backend
    iter_stats_max_iterations kv_cache_config kv_connector_config load_format lora_config
    max_batch_size max_beam_width max_input_len max_num_tokens max_seq_len mm_encoder_only model
    moe_cluster_parallel_size moe_config moe_expert_parallel_size moe_tensor_parallel_size
    mpi_session num_postprocess_workers nvfp4_gemm_config orchestrator_type otlp_traces_endpoint
    peft_cache_config perf_metrics_max_requests pipeline_parallel_size postprocess_tokenizer_dir
    pp_partition print_iter_log ray_placement_config ray_worker_extension_cls reasoning_parser
    request_stats_max_iterations return_perf_metrics revision sampler_force_async_worker
    sampler_type scheduler_config skip_tokenizer_init sparse_attention_config speculative_config
    stream_interval tensor_parallel_size tokenizer tokenizer_mode tokenizer_revision
    torch_compile_config trust_remote_code
"""),
        trt_only=_names("""
    batching_type build_config calib_config embedding_parallel_mode enable_build_cache
    enable_prompt_adapter enable_tqdm extended_runtime_perf_knob_config fast_build
    max_prompt_adapter_token normalize_log_probs quant_config workspace
"""),
        nested={k: _names(v) for k, v in {
            "kv_cache_config": """
    attention_dp_events_gather_period_ms copy_on_partial_reuse cross_kv_cache_fraction dtype
    enable_block_reuse enable_partial_reuse event_buffer_max_size free_gpu_memory_fraction
    host_cache_size mamba_ssm_cache_dtype max_attention_window max_gpu_total_bytes max_tokens
    onboard_blocks secondary_offload_min_priority sink_token_length tokens_per_block use_uvm
""",
            "scheduler_config": "capacity_scheduler_policy context_chunking_policy dynamic_batch_config",
            "cuda_graph_config": "batch_sizes enable_padding max_batch_size",
            "lora_config": """
    lora_dir lora_ckpt_source max_lora_rank lora_target_modules trtllm_modules_to_hf_modules max_loras
    max_cpu_loras swap_gate_up_proj_lora_b_weight
""",
        }.items()},
        speculative=_decoding(
            "max_draft_len max_total_draft_tokens speculative_model_dir max_concurrency draft_len_schedule "
            "load_format acceptance_window acceptance_length_threshold allow_advanced_sampling",
            Eagle="eagle_choices greedy_sampling posterior_threshold use_dynamic_tree dynamic_tree_max_topK "
                  "num_eagle_layers max_non_leaves_per_layer eagle3_one_model eagle3_layers_to_capture",
            NGram="max_matching_ngram_size is_keep_all is_use_oldest is_public_pool",
            DraftTarget="",
            MTP="num_nextn_predict_layers use_relaxed_acceptance_for_thinking relaxed_topk relaxed_delta "
                "use_mtp_vanilla mtp_eagle_one_model num_nextn_predict_layers_from_model_config "
                "begin_thinking_phase_token end_thinking_phase_token"),
        guided_decoding_backends=_names("xgrammar llguidance")),
    "1.4": LlmApiArgs(
        source="NVIDIA/TensorRT-LLM@44373a31ee62 tensorrt_llm/llmapi/llm_args.py",
        fields=_names("""
    allreduce_strategy attention_dp_config attn_backend backend batch_wait_max_tokens_ratio
    batch_wait_timeout_iters batch_wait_timeout_ms batched_logits_processor cache_transceiver_config
    checkpoint_format checkpoint_io_policy checkpoint_loader context_parallel_size cp_config
    cuda_graph_config custom_tokenizer decoding_config disable_mm_encoder disable_overlap_scheduler
    dtype dwdp_config enable_attention_dp enable_autotuner enable_chunked_prefill
    enable_early_first_token_response enable_encoder_decoder_mixed_cuda_graph enable_energy_metrics
    enable_in_graph_sampling enable_iter_perf_stats enable_iter_req_stats
    enable_layerwise_nvtx_marker enable_lm_head_tp_in_adp enable_lora
    enable_low_latency_host_dispatch enable_min_latency enable_mla_skip_correction
    enable_resource_governor enable_return_routed_experts enable_speculative_beam_history_d2h
    enable_tokenization_cache encode_only encoder_cuda_graph_config encoder_max_batch_size
    encoder_max_num_tokens env_overrides force_dynamic_quantization
    garbage_collection_gen0_threshold gather_generation_logits generation_config gms_config
    gpus_per_node guided_decoding_backend iter_stats_max_iterations kv_cache_compression_config
    kv_cache_config kv_connector_config layer_wise_benchmarks_config load_format lora_config
    max_batch_size max_beam_width max_input_len max_num_tokens max_seq_len max_stats_len
    mla_skip_correction_threshold mm_encoder_only model model_kwargs moe_cluster_parallel_size
    moe_config moe_expert_parallel_size moe_tensor_parallel_size mpi_session multimodal_config
    mx_config num_postprocess_workers num_serve_frontends nvfp4_gemm_config orchestrator_type
    otlp_traces_endpoint peft_cache_config perf_metrics_max_requests perf_metrics_output_dir
    pipeline_parallel_size post_processor_hook postprocess_tokenizer_dir pp_partition
    prefill_capture_num_tokens prefill_cuda_graph_backend print_iter_log prometheus_metrics_config
    ray_placement_config ray_worker_extension_cls ray_worker_nsight_options reasoning_parser
    reorder_policy_config request_stats_max_iterations return_perf_metrics revision
    sampler_force_async_worker scheduler_config skip_tokenizer_init sleep_config
    sparse_attention_config speculative_config stream_interval telemetry_config tensor_parallel_size
    tokenizer tokenizer_mode tokenizer_revision torch_compile_config trust_remote_code
    use_cute_dsl_bf16_bmm use_cute_dsl_bf16_gemm use_cute_dsl_blockscaling_bmm
    use_cute_dsl_blockscaling_mm use_fine_grained_sync
"""),
        trt_only=_names("""

"""),
        nested={k: _names(v) for k, v in {
            "kv_cache_config": """
    attention_dp_events_gather_period_ms avg_seq_len block_reuse_config copy_on_partial_reuse
    cross_kv_cache_fraction disk_cache_path disk_cache_size disk_prefetch_num_reqs dtype
    enable_block_reuse enable_kv_pool_rebalance enable_partial_reuse enable_swa_scratch_reuse
    event_buffer_max_size fp8_context_mla_kv_len_cap free_gpu_memory_fraction host_cache_size
    iteration_stats_interval kv_cache_event_hash_algo kv_events_config mamba_ssm_cache_dtype
    mamba_ssm_philox_rounds mamba_ssm_stochastic_rounding mamba_state_cache_interval
    mamba_state_config max_attention_window max_gpu_total_bytes max_tokens max_util_for_resume
    pool_ratio secondary_offload_min_priority sink_token_length tokens_per_block
    use_kv_cache_manager_v2 use_uvm
""",
            "scheduler_config": "capacity_scheduler_policy context_chunking_policy dynamic_batch_config enable_prefix_aware_scheduling use_python_scheduler waiting_queue_policy",
            "cuda_graph_config": "batch_sizes enable_padding max_batch_size mode",
            "lora_config": """
    lora_dir lora_ckpt_source max_lora_rank lora_target_modules trtllm_modules_to_hf_modules max_loras
    max_cpu_loras swap_gate_up_proj_lora_b_weight overlap_lora_and_base cuda_graph_specialize_lora
""",
        }.items()},
        speculative=_decoding(
            "max_draft_len max_total_draft_tokens speculative_model speculative_model_dir moe_backend "
            "max_concurrency draft_len_schedule load_format acceptance_rate_window_size acceptance_rate_threshold "
            "use_rejection_sampling allow_advanced_sampling advanced_sampling_mode enable_penalty",
            Eagle3="use_dynamic_tree dynamic_tree_max_topK num_eagle_layers max_non_leaves_per_layer "
                   "eagle3_layers_to_capture eagle3_model_arch sa_config",
            Eagle="use_dynamic_tree dynamic_tree_max_topK num_eagle_layers max_non_leaves_per_layer "
                  "eagle3_layers_to_capture eagle3_model_arch",
            NGram="max_matching_ngram_size is_keep_all is_use_oldest is_public_pool",
            Draft_Target="",
            MTP="use_relaxed_acceptance_for_thinking relaxed_topk relaxed_delta use_mtp_vanilla use_dynamic_tree "
                "dynamic_tree_max_topK sa_config num_nextn_predict_layers begin_thinking_phase_token "
                "end_thinking_phase_token"),
        guided_decoding_backends=_names("xgrammar llguidance")),
}

"""Every release the HF-checkpoint path supports, oldest first: 1.2.1 (the Triton containers 26.04-26.07) and the
newest 1.4 pre-release cycle."""
