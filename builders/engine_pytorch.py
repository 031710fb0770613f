"""Engine for the portable ``pytorch`` runtime.

The "engine" is a Hugging Face checkpoint folder whose weights are the checkpoint's (TensorRT-LLM rank
shards merged, or ModelOpt's unified HF export), dequantized (:mod:`builders.checkpoint`), so the model
the runtime serves carries the real quantization error of the build. Beside the weights:
the source model's config.json, tokenizer files and generation_config.json, and
``engine.json`` holding the build limits the runtime enforces (the equivalent of a
TensorRT-LLM engine's ``build_config``) and the attention implementation the family needs
(plugins.architectures: ``portable_attention``).
"""

from __future__ import annotations

import json
from pathlib import Path

from builders.checkpoint import write_dequantized
from builders.model_fetch import copy_tokenizer
from builders.spec import LimitsConfig
from plugins.architectures import architecture

ENGINE_FORMAT_VERSION = 1


def build_pytorch_engine(ckpt_dir: Path, hf_dir: Path, out_dir: Path, *, limits: LimitsConfig) -> dict:
    """Write the portable runtime's engine folder.

    Args:
        ckpt_dir: TensorRT-LLM checkpoint (config.json + rank*.safetensors) or unified HF checkpoint.
        hf_dir: the source HF folder (for config.json and the tokenizer).
        out_dir: empty folder to fill.
        limits: the build limits, recorded in engine.json ``build_config``.

    Returns:
        engine.json's content.

    Raises:
        StageError: the checkpoint does not map onto the source architecture.
    """
    hf_cfg = json.loads((hf_dir / "config.json").read_text())
    info, _ = write_dequantized(ckpt_dir, hf_dir, out_dir)
    dtype_name = info.config.get("dtype") or info.config.get("torch_dtype") or "float16"
    arch = architecture((hf_cfg.get("architectures") or [None])[0])
    copy_tokenizer(hf_dir, out_dir)
    engine = {
        "format": "trtpipe-pytorch-engine",
        "format_version": ENGINE_FORMAT_VERSION,
        "runtime": "pytorch",
        "checkpoint_format": info.format,
        "checkpoint_quant_algo": info.quant_algo,
        "checkpoint_group_size": info.group_size,
        "mapping": {"tp_size": info.tp_size, "pp_size": info.pp_size, "world_size": info.world_size},
        "build_config": limits.as_dict(),
        "attn_implementation": arch.portable_attention if arch else "sdpa",
        "pretrained_config": {"architecture": (hf_cfg.get("architectures") or [None])[0], "dtype": dtype_name,
                              **{k: hf_cfg.get(k) for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                                            "num_attention_heads", "num_key_value_heads",
                                                            "max_position_embeddings")},
                              "head_size": info.head_size},
    }
    (out_dir / "engine.json").write_text(json.dumps(engine, indent=2) + "\n")
    return engine
