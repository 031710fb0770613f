"""Read a TensorRT-LLM checkpoint back into a Hugging Face Llama state dict.

Undoes what ``export_tensorrt_llm_checkpoint`` did: pipeline parallelism (layer indices are
local to each PP rank), tensor parallelism (column-parallel layers are split on the output
dim, row-parallel on the input dim, K/V heads duplicated when ``num_key_value_heads <
tp_size``, vocab padded to a multiple of tp for the embedding and lm_head), and
quantization (FP8 per-tensor scales; W4A16/W4A8 AWQ packed INT4 with per-group scales and
the AWQ pre-quant scale folded into the weight; W4A8 also rounds the dequantized INT4 values
through FP8 with the per-tensor ``weights_scaling_factor_2``, as ModelOpt's fake quantization
does; INT8 SmoothQuant per-channel scales and smoothing vectors). Activation and KV-cache
scaling factors (``activation_scaling_factor``, ``kv_cache_scaling_factor``) do not change
weights and are ignored. The result is float32 tensors under HF
names, so the served or evaluated model carries exactly the checkpoint's quantization error.

Formats: TensorRT-LLM ``tensorrt_llm/models/llama`` checkpoint layout and ModelOpt 0.47
``modelopt/torch/export`` packing (INT4: two signed nibbles per byte along the output
dim, low nibble = even row; dequant = q * scale[o, i // group_size]).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from plugins.errors import StageError


@dataclass(frozen=True)
class CheckpointInfo:
    """What ``config.json`` of a TensorRT-LLM checkpoint says (the fields the reader needs)."""

    config: dict
    tp_size: int
    pp_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    hidden_size: int
    vocab_size: int
    quant_algo: str | None
    group_size: int

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @classmethod
    def read(cls, ckpt_dir: Path) -> "CheckpointInfo":
        cfg_path = Path(ckpt_dir) / "config.json"
        if not cfg_path.is_file():
            raise StageError(f"{ckpt_dir} is not a TensorRT-LLM checkpoint: config.json is missing")
        cfg = json.loads(cfg_path.read_text())
        mapping = cfg.get("mapping", {})
        q = cfg.get("quantization") or {}
        heads = cfg["num_attention_heads"]
        return cls(config=cfg, tp_size=mapping.get("tp_size", 1), pp_size=mapping.get("pp_size", 1),
                   num_layers=cfg["num_hidden_layers"], num_heads=heads,
                   num_kv_heads=cfg.get("num_key_value_heads") or heads,
                   head_size=cfg.get("head_size") or cfg["hidden_size"] // heads,
                   hidden_size=cfg["hidden_size"], vocab_size=cfg["vocab_size"],
                   quant_algo=q.get("quant_algo"), group_size=q.get("group_size") or 128)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack ``(out/2, in)`` int8/uint8 bytes into ``(out, in)`` int8 values in [-8, 7].

    Byte ``packed[j, i]`` holds row ``2j`` in its low nibble and row ``2j+1`` in its high nibble
    (ModelOpt ``pack_int4_in_uint8``).
    """
    b = packed.view(torch.uint8).to(torch.int16)
    low = b & 0x0F
    high = (b >> 4) & 0x0F
    low = torch.where(low >= 8, low - 16, low)
    high = torch.where(high >= 8, high - 16, high)
    out = torch.stack([low, high], dim=1)  # (out/2, 2, in)
    return out.reshape(-1, packed.shape[-1]).to(torch.int8)


def dequantize_linear(tensors: dict[str, torch.Tensor], prefix: str, quant_algo: str | None,
                      group_size: int) -> torch.Tensor:
    """Dequantize one linear layer's rank shard into float32 ``(out, in)``.

    Args:
        tensors: the rank's tensors.
        prefix: e.g. ``transformer.layers.0.attention.qkv``.
        quant_algo: checkpoint ``quant_algo`` (None, FP8, W4A16_AWQ, W4A8_AWQ, W8A8_SQ_PER_CHANNEL...).
        group_size: INT4 group size along the input dim.
    """
    w = tensors[f"{prefix}.weight"]
    scale = tensors.get(f"{prefix}.weights_scaling_factor")
    if w.dtype == torch.float8_e4m3fn:
        out = w.to(torch.float32) * scale.to(torch.float32)
    elif w.dtype in (torch.int8, torch.uint8) and quant_algo in ("W4A16_AWQ", "W4A8_AWQ", "W4A16"):
        q = unpack_int4(w).to(torch.float32)
        s = scale.to(torch.float32)
        if s.shape[0] != q.shape[0]:  # some exporters store (in/group, out)
            s = s.T
        out = q * s.repeat_interleave(group_size, dim=1)[:, :q.shape[1]]
        s2 = tensors.get(f"{prefix}.weights_scaling_factor_2")
        if quant_algo == "W4A8_AWQ" and s2 is not None:
            # The W4A8 kernel feeds FP8 weights to the GEMM: q*s is rounded to FP8 in units of s2.
            s2 = s2.to(torch.float32)
            out = (out / s2).to(torch.float8_e4m3fn).to(torch.float32) * s2
    elif w.dtype == torch.int8 and scale is not None:  # INT8 per-channel (SmoothQuant / W8A16)
        s = scale.to(torch.float32)
        out = w.to(torch.float32) * (s.reshape(-1, 1) if s.numel() == w.shape[0] else s)
    elif w.dtype == torch.int8:
        raise StageError(f"{prefix}: int8 weight without weights_scaling_factor (quant_algo={quant_algo})")
    else:
        out = w.to(torch.float32)
    pqs = tensors.get(f"{prefix}.prequant_scaling_factor")
    if pqs is not None:  # AWQ / SmoothQuant: y = (x * pqs) @ W^T  ==  x @ (W * pqs)^T
        out = out * pqs.to(torch.float32).reshape(1, -1)
    return out


def _load_rank(ckpt_dir: Path, rank: int) -> dict[str, torch.Tensor]:
    path = ckpt_dir / f"rank{rank}.safetensors"
    if not path.is_file():
        raise StageError(f"{ckpt_dir}: missing {path.name} (the checkpoint's mapping says world_size "
                         f"covers rank {rank})")
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _merge_kv(shards: list[torch.Tensor], num_kv_heads: int, tp: int) -> torch.Tensor:
    """Merge K or V shards; when heads were duplicated (kv < tp), keep one copy of each head."""
    if num_kv_heads >= tp:
        return torch.cat(shards, dim=0)
    ranks_per_head = tp // num_kv_heads
    return torch.cat([shards[h * ranks_per_head] for h in range(num_kv_heads)], dim=0)


def to_hf_state_dict(ckpt_dir: str | Path, vocab_size: int | None = None
                     ) -> tuple[dict[str, torch.Tensor], CheckpointInfo]:
    """Merge all rank shards of a Llama-family checkpoint and dequantize them into HF names.

    Args:
        ckpt_dir: the checkpoint folder.
        vocab_size: the source model's vocabulary. ModelOpt pads the embedding and lm_head of
            AWQ exports to a multiple of 64 and writes the padded size into config.json; the
            padded rows are cut off here. None keeps config.json's ``vocab_size``.

    Returns:
        (state_dict with float32 tensors named like ``LlamaForCausalLM.state_dict()``, info).

    Raises:
        StageError: a rank file is missing, or a tensor is missing or has an unexpected shape.
    """
    ckpt_dir = Path(ckpt_dir)
    info = CheckpointInfo.read(ckpt_dir)
    if vocab_size is not None and vocab_size > info.vocab_size:
        raise StageError(f"{ckpt_dir}: checkpoint vocab_size {info.vocab_size} is smaller than the source "
                         f"model's {vocab_size}")
    vocab = vocab_size or info.vocab_size
    tp, pp = info.tp_size, info.pp_size
    if info.num_layers % pp:
        raise StageError(f"num_hidden_layers {info.num_layers} is not divisible by pp_size {pp}")
    layers_per_rank = info.num_layers // pp
    ranks = [_load_rank(ckpt_dir, r) for r in range(tp * pp)]
    qa, gs = info.quant_algo, info.group_size
    hd = info.head_size
    q_rows = info.num_heads // tp * hd
    kv_rows = max(1, info.num_kv_heads // tp) * hd
    sd: dict[str, torch.Tensor] = {}

    def rank(tp_rank: int, pp_rank: int) -> dict[str, torch.Tensor]:
        return ranks[pp_rank * tp + tp_rank]

    try:
        for pp_rank in range(pp):
            for local in range(layers_per_rank):
                g = pp_rank * layers_per_rank + local
                src = f"transformer.layers.{local}"
                dst = f"model.layers.{g}"
                shards = [rank(t, pp_rank) for t in range(tp)]
                sd[f"{dst}.input_layernorm.weight"] = shards[0][f"{src}.input_layernorm.weight"].float()
                sd[f"{dst}.post_attention_layernorm.weight"] = shards[0][f"{src}.post_layernorm.weight"].float()
                qkv = [dequantize_linear(s, f"{src}.attention.qkv", qa, gs) for s in shards]
                for part in qkv:
                    if part.shape[0] != q_rows + 2 * kv_rows:
                        raise StageError(f"{src}.attention.qkv has {part.shape[0]} rows per rank, expected "
                                         f"{q_rows} + 2 x {kv_rows}")
                sd[f"{dst}.self_attn.q_proj.weight"] = torch.cat([p[:q_rows] for p in qkv], dim=0)
                sd[f"{dst}.self_attn.k_proj.weight"] = _merge_kv([p[q_rows:q_rows + kv_rows] for p in qkv],
                                                                 info.num_kv_heads, tp)
                sd[f"{dst}.self_attn.v_proj.weight"] = _merge_kv([p[q_rows + kv_rows:] for p in qkv],
                                                                 info.num_kv_heads, tp)
                sd[f"{dst}.self_attn.o_proj.weight"] = torch.cat(
                    [dequantize_linear(s, f"{src}.attention.dense", qa, gs) for s in shards], dim=1)
                sd[f"{dst}.mlp.gate_proj.weight"] = torch.cat(
                    [dequantize_linear(s, f"{src}.mlp.fc", qa, gs) for s in shards], dim=0)
                sd[f"{dst}.mlp.up_proj.weight"] = torch.cat(
                    [dequantize_linear(s, f"{src}.mlp.gate", qa, gs) for s in shards], dim=0)
                sd[f"{dst}.mlp.down_proj.weight"] = torch.cat(
                    [dequantize_linear(s, f"{src}.mlp.proj", qa, gs) for s in shards], dim=1)
        first = [rank(t, 0) for t in range(tp)]
        last = [rank(t, pp - 1) for t in range(tp)]
        emb_dim = info.config.get("embedding_sharding_dim", 0)
        if info.config.get("use_parallel_embedding", False) and tp > 1:
            emb = torch.cat([s["transformer.vocab_embedding.weight"] for s in first], dim=emb_dim)
        else:
            emb = first[0]["transformer.vocab_embedding.weight"]
        sd["model.embed_tokens.weight"] = emb[:vocab].float()
        sd["model.norm.weight"] = last[0]["transformer.ln_f.weight"].float()
        lm = [dequantize_linear(s, "lm_head", qa, gs) for s in last] if "lm_head.weight" in last[0] else None
        if lm is not None:
            sd["lm_head.weight"] = torch.cat(lm, dim=0)[:vocab]
    except KeyError as exc:
        raise StageError(f"{ckpt_dir}: tensor {exc} missing from the checkpoint") from exc
    return sd, info
