#!/usr/bin/env python3
"""Test double for TensorRT-LLM 1.2.1's ``trtllm-build``.

It accepts exactly the flags (names and value sets) that ``trtllm-build`` 1.2 accepts and
rejects anything else with argparse's usage error (exit 2), like the real one. Source of the
flag list: TensorRT-LLM ``tensorrt_llm/commands/build.py`` (parse_arguments) and
``tensorrt_llm/plugin/plugin.py`` (cli_plugin_args, DEFAULT_PLUGIN_DTYPE_OPTIONS,
PLUGIN_DTYPE_OPTIONS_MAP) of the 1.x line, read through the project's code search. The
auto-parallel flags of older releases are left out: the pipeline never passes them.

Then it writes a fake engine folder (config.json with ``build_config`` and ``pretrained_config``,
one ``rank{r}.engine`` per rank of the checkpoint's mapping) so the output check can run.
Environment knobs for tests: TRTPIPE_DOUBLE_SLEEP (seconds to sleep mid-build, printing
progress), TRTPIPE_DOUBLE_MISMATCH=1 (write a max_batch_size different from the request),
TRTPIPE_DOUBLE_SKIP_RANK=1 (leave out the last rank file), TRTPIPE_DOUBLE_ARGV (file that
receives the argv as JSON).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

DTYPE = ["auto", "float16", "float32", "bfloat16", "int32", "disable"]
PLUGIN_CHOICES = {
    "bert_attention_plugin": DTYPE, "gpt_attention_plugin": DTYPE,
    "gemm_plugin": ["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"],
    "gemm_swiglu_plugin": ["fp8", "disable"], "fp8_rowwise_gemm_plugin": DTYPE, "lora_plugin": DTYPE,
    "moe_plugin": DTYPE, "mamba_conv1d_plugin": DTYPE, "nccl_plugin": DTYPE,
    "low_latency_gemm_plugin": ["fp8", "disable"], "low_latency_gemm_swiglu_plugin": ["fp8", "disable"],
    "gemm_allreduce_plugin": ["float16", "bfloat16", "disable"],
}
FEATURES = ["dora_plugin", "context_fmha", "bert_context_fmha_fp32_acc", "remove_input_padding",
            "use_paged_context_fmha", "use_fp8_context_fmha", "fuse_fp4_quant", "multiple_profiles", "paged_state",
            "streamingllm", "norm_quant_fusion", "reduce_fusion", "user_buffer", "use_fused_mlp",
            "pp_reduce_scatter"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trtllm-build")
    for name in ("checkpoint_dir", "model_config", "build_config", "model_cls_file", "model_cls_name",
                 "input_timing_cache", "output_timing_cache", "visualize_network", "paged_kv_cache"):
        p.add_argument(f"--{name}", type=str)
    p.add_argument("--output_dir", type=str, default="engine_outputs")
    for name in ("max_batch_size", "max_input_len", "max_beam_width", "max_num_tokens", "opt_num_tokens",
                 "max_encoder_input_len", "max_draft_len", "max_lora_rank", "workers", "tokens_per_block"):
        p.add_argument(f"--{name}", type=int)
    p.add_argument("--max_seq_len", "--max_decoder_seq_len", dest="max_seq_len", type=int)
    p.add_argument("--max_prompt_embedding_table_size", "--max_multimodal_len", type=int)
    p.add_argument("--kv_cache_type", choices=["continuous", "paged", "disabled"])
    p.add_argument("--profiling_verbosity", choices=["layer_names_only", "detailed", "none"])
    for flag in ("strip_plan", "weight_sparsity", "weight_streaming", "fast_build", "enable_debug_output",
                 "dry_run", "monitor_memory", "gather_context_logits", "gather_generation_logits",
                 "gather_all_token_logits"):
        p.add_argument(f"--{flag}", action="store_true")
    p.add_argument("--log_level", choices=["internal_error", "error", "warning", "info", "verbose", "debug", "trace"])
    p.add_argument("--logits_dtype", choices=["float16", "float32"])
    p.add_argument("--lora_dir", nargs="+")
    p.add_argument("--lora_ckpt_source", choices=["hf", "nemo"])
    p.add_argument("--lora_target_modules", nargs="+")
    p.add_argument("--speculative_decoding_mode",
                   choices=["draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"])
    for name, choices in PLUGIN_CHOICES.items():
        p.add_argument(f"--{name}", choices=choices)
    for name in FEATURES:
        p.add_argument(f"--{name}", choices=["enable", "disable"])
    return p


def main() -> int:
    args = parser().parse_args()
    if os.environ.get("TRTPIPE_DOUBLE_ARGV"):
        Path(os.environ["TRTPIPE_DOUBLE_ARGV"]).write_text(json.dumps(sys.argv))
    if args.checkpoint_dir is None:
        print("error: --checkpoint_dir is required here", file=sys.stderr)
        return 2
    ckpt = json.loads((Path(args.checkpoint_dir) / "config.json").read_text())
    world = ckpt.get("mapping", {}).get("world_size", 1)
    print("[TRT-LLM] [I] Set dtype to %s." % ckpt.get("dtype"), flush=True)
    delay = float(os.environ.get("TRTPIPE_DOUBLE_SLEEP", "0"))
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        print(f"[TRT-LLM] [I] building rank {r}", flush=True)
        time.sleep(delay)
        if os.environ.get("TRTPIPE_DOUBLE_SKIP_RANK") and r == world - 1:
            continue
        (out / f"rank{r}.engine").write_bytes(b"fake engine " + bytes(str(r), "ascii"))
    mbs = args.max_batch_size + (1 if os.environ.get("TRTPIPE_DOUBLE_MISMATCH") else 0)
    cfg = {"version": "1.2.1", "pretrained_config": ckpt,
           "build_config": {"max_batch_size": mbs, "max_input_len": args.max_input_len,
                            "max_seq_len": args.max_seq_len, "max_num_tokens": args.max_num_tokens,
                            "max_beam_width": args.max_beam_width,
                            "plugin_config": {"tokens_per_block": args.tokens_per_block}}}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if args.output_timing_cache:
        Path(args.output_timing_cache).write_bytes(b"timing cache")
    print("[TRT-LLM] [I] Total time of building all engines: 00:00:00", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
