"""Engine for the portable ``pytorch`` runtime.

The "engine" is a Hugging Face checkpoint folder whose weights are the TensorRT-LLM
checkpoint's, merged over ranks and dequantized (:mod:`builders.checkpoint`), so the model
the runtime serves carries the real quantization error of the build. Beside the weights:
the source model's config.json, tokenizer files and generation_config.json, and
``engine.json`` holding the build limits the runtime enforces (the equivalent of a
TensorRT-LLM engine's ``build_config``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from builders.checkpoint import to_hf_state_dict
from builders.model_fetch import copy_tokenizer
from builders.spec import LimitsConfig
from plugins.errors import StageError

ENGINE_FORMAT_VERSION = 1


def build_pytorch_engine(ckpt_dir: Path, hf_dir: Path, out_dir: Path, *, limits: LimitsConfig) -> dict:
    """Write the portable runtime's engine folder.

    Args:
        ckpt_dir: TensorRT-LLM checkpoint (config.json + rank*.safetensors).
        hf_dir: the source HF folder (for config.json and the tokenizer).
        out_dir: empty folder to fill.
        limits: the build limits, recorded in engine.json ``build_config``.

    Returns:
        engine.json's content.

    Raises:
        StageError: the checkpoint does not map onto the source architecture.
    """
    hf_cfg = json.loads((hf_dir / "config.json").read_text())
    sd, info = to_hf_state_dict(ckpt_dir, vocab_size=hf_cfg.get("vocab_size"))
    if hf_cfg.get("num_hidden_layers") != info.num_layers:
        raise StageError("checkpoint and source model disagree on num_hidden_layers: "
                         f"{info.num_layers} vs {hf_cfg.get('num_hidden_layers')}")
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(info.config.get("dtype"), torch.float16)
    tied = bool(hf_cfg.get("tie_word_embeddings"))
    if tied and "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"]):
        tied = False  # a quantized or separately exported lm_head: keep it
    if tied:
        sd.pop("lm_head.weight", None)
    hf_cfg["tie_word_embeddings"] = tied
    hf_cfg.pop("quantization_config", None)
    hf_cfg["torch_dtype"] = info.config.get("dtype", "float16")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype).contiguous() for k, v in sd.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt", "source": "trtpipe dequantized TensorRT-LLM checkpoint"})
    (out_dir / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    copy_tokenizer(hf_dir, out_dir)
    engine = {
        "format": "trtpipe-pytorch-engine",
        "format_version": ENGINE_FORMAT_VERSION,
        "runtime": "pytorch",
        "checkpoint_quant_algo": info.quant_algo,
        "checkpoint_group_size": info.group_size,
        "mapping": {"tp_size": info.tp_size, "pp_size": info.pp_size, "world_size": info.world_size},
        "build_config": limits.as_dict(),
        "pretrained_config": {k: info.config.get(k) for k in (
            "architecture", "dtype", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_size", "max_position_embeddings", "rotary_base")},
    }
    (out_dir / "engine.json").write_text(json.dumps(engine, indent=2) + "\n")
    return engine
