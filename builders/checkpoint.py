"""Read a checkpoint the pipeline exported back into a Hugging Face state dict (float32, dequantized).

Two formats: the TensorRT-LLM checkpoint (:func:`to_hf_state_dict`) and ModelOpt's unified HF
checkpoint (:func:`hf_unified_state_dict`); :func:`read_checkpoint` takes either.

The TensorRT-LLM reader:

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

Formats: TensorRT-LLM ``tensorrt_llm/models/llama`` and ``models/qwen`` checkpoint layouts (Qwen adds
``attention.qkv.bias`` and, for Qwen3, ``attention.q_layernorm``/``k_layernorm``) and ModelOpt 0.47
``modelopt/torch/export`` packing (INT4: two signed nibbles per byte along the output
dim, low nibble = even row; dequant = q * scale[o, i // group_size]). The unified HF checkpoint
(``unified_export_hf.py``) keeps the source model's own tensor names with the same packing, its scales
named ``weight_scale``/``weight_scale_2``/``pre_quant_scale`` and its group size in ``hf_quant_config.json``.
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
    format: str = "trtllm"
    """``trtllm`` (rank shards) or ``hf_unified``."""
    kv_cache_quant_algo: str | None = None

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
                   quant_algo=q.get("quant_algo"), group_size=q.get("group_size") or 128,
                   kv_cache_quant_algo=q.get("kv_cache_quant_algo"))

    @classmethod
    def read_hf(cls, ckpt_dir: Path) -> "CheckpointInfo":
        """The unified HF checkpoint's config.json and hf_quant_config.json (no quantization: neither key)."""
        cfg = json.loads((Path(ckpt_dir) / "config.json").read_text())
        qpath = Path(ckpt_dir) / "hf_quant_config.json"
        q = json.loads(qpath.read_text()).get("quantization", {}) if qpath.is_file() else {}
        if not q and (cfg.get("quantization_config") or {}).get("quant_method") == "modelopt":
            q = cfg["quantization_config"]  # ModelOpt writes its recipe into config.json too
        heads = cfg["num_attention_heads"]
        return cls(config=cfg, tp_size=1, pp_size=1, num_layers=cfg["num_hidden_layers"], num_heads=heads,
                   num_kv_heads=cfg.get("num_key_value_heads") or heads,
                   head_size=cfg.get("head_dim") or cfg["hidden_size"] // heads, hidden_size=cfg["hidden_size"],
                   vocab_size=cfg["vocab_size"], quant_algo=q.get("quant_algo"), group_size=q.get("group_size") or 128,
                   format="hf_unified", kv_cache_quant_algo=q.get("kv_cache_quant_algo"))


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


@dataclass(frozen=True)
class ScaleNames:
    """What a format calls a linear layer's scales (suffixes after ``<prefix>.``)."""

    scale: str
    scale_2: str
    pre_quant: str


TRTLLM_SCALES = ScaleNames("weights_scaling_factor", "weights_scaling_factor_2", "prequant_scaling_factor")
"""TensorRT-LLM checkpoint (docs/source/architecture/checkpoint.md)."""
HF_UNIFIED_SCALES = ScaleNames("weight_scale", "weight_scale_2", "pre_quant_scale")
"""ModelOpt's unified HF checkpoint (modelopt/torch/export/unified_export_hf.py)."""


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""FP4 (E2M1) magnitudes by the low three bits of a nibble; bit 3 is the sign (OCP microscaling formats)."""


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Unpack ``(out, in/2)`` uint8 bytes of two E2M1 values each into float32 ``(out, in)`` (low nibble first)."""
    b = packed.view(torch.uint8).to(torch.int64)
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)
    return torch.stack([table[b & 0x0F], table[(b >> 4) & 0x0F]], dim=-1).reshape(packed.shape[0], -1)


def dequantize_linear(tensors: dict[str, torch.Tensor], prefix: str, quant_algo: str | None,
                      group_size: int, names: ScaleNames = TRTLLM_SCALES) -> torch.Tensor:
    """Dequantize one linear layer's weight into float32 ``(out, in)``.

    Args:
        tensors: the rank's (or the unified checkpoint's) tensors.
        prefix: e.g. ``transformer.layers.0.attention.qkv`` or ``model.layers.0.self_attn.q_proj``.
        quant_algo: checkpoint ``quant_algo`` (None, FP8, W4A16_AWQ, W4A8_AWQ, W8A8_SQ_PER_CHANNEL...).
        group_size: INT4 group size along the input dim.
        names: the format's scale tensor names.
    """
    w = tensors[f"{prefix}.weight"]
    scale = tensors.get(f"{prefix}.{names.scale}")
    if quant_algo == "NVFP4" and w.dtype == torch.uint8 and scale is not None:
        # Two E2M1 values per byte along the input (low nibble = even input), one FP8 scale per 16 inputs, and
        # the per-tensor weight_scale_2 (ModelOpt 0.47 unified_export_hf / nvfp4_tensor.py).
        q = unpack_e2m1(w)
        s = scale.to(torch.float32).repeat_interleave(q.shape[1] // scale.shape[1], dim=1)
        out = q * s * tensors[f"{prefix}.{names.scale_2}"].to(torch.float32)
    elif w.dtype == torch.float8_e4m3fn:
        out = w.to(torch.float32) * scale.to(torch.float32)
    elif w.dtype in (torch.int8, torch.uint8) and quant_algo in ("W4A16_AWQ", "W4A8_AWQ", "W4A16"):
        q = unpack_int4(w).to(torch.float32)
        s = scale.to(torch.float32)
        if s.shape[0] != q.shape[0]:  # some exporters store (in/group, out)
            s = s.T
        out = q * s.repeat_interleave(group_size, dim=1)[:, :q.shape[1]]
        s2 = tensors.get(f"{prefix}.{names.scale_2}")
        if quant_algo == "W4A8_AWQ" and s2 is not None:
            # The W4A8 kernel feeds FP8 weights to the GEMM: q*s is rounded to FP8 in units of s2.
            s2 = s2.to(torch.float32)
            out = (out / s2).to(torch.float8_e4m3fn).to(torch.float32) * s2
    elif w.dtype == torch.int8 and scale is not None:  # INT8 per-channel (SmoothQuant / W8A16)
        s = scale.to(torch.float32)
        out = w.to(torch.float32) * (s.reshape(-1, 1) if s.numel() == w.shape[0] else s)
    elif w.dtype == torch.int8:
        raise StageError(f"{prefix}: int8 weight without {names.scale} (quant_algo={quant_algo})")
    else:
        out = w.to(torch.float32)
    pqs = tensors.get(f"{prefix}.{names.pre_quant}")
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
    """Merge all rank shards of a Llama- or Qwen-layout TensorRT-LLM checkpoint, dequantized, into HF names.

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
                if f"{src}.attention.qkv.bias" in shards[0]:  # Qwen2: q/k/v bias, split like the weight rows
                    bias = [s[f"{src}.attention.qkv.bias"].float() for s in shards]
                    sd[f"{dst}.self_attn.q_proj.bias"] = torch.cat([b[:q_rows] for b in bias])
                    sd[f"{dst}.self_attn.k_proj.bias"] = _merge_kv([b[q_rows:q_rows + kv_rows] for b in bias],
                                                                   info.num_kv_heads, tp)
                    sd[f"{dst}.self_attn.v_proj.bias"] = _merge_kv([b[q_rows + kv_rows:] for b in bias],
                                                                   info.num_kv_heads, tp)
                for ours, hf in (("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")):  # Qwen3: per-head norms
                    if f"{src}.attention.{ours}.weight" in shards[0]:
                        sd[f"{dst}.self_attn.{hf}.weight"] = shards[0][f"{src}.attention.{ours}.weight"].float()
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


_HF_SCALE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".pre_quant_scale", ".input_scale", ".k_scale", ".v_scale")


def _load_hf_tensors(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(ckpt_dir.glob("*.safetensors"))
    if not files:
        raise StageError(f"{ckpt_dir}: no *.safetensors: not a unified HF checkpoint (the checkpoint stage did not "
                         "complete; rerun the build)")
    out: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def hf_unified_state_dict(ckpt_dir: str | Path, vocab_size: int | None = None
                          ) -> tuple[dict[str, torch.Tensor], CheckpointInfo]:
    """Dequantize ModelOpt's unified HF checkpoint into float32 tensors under the same (source) names.

    Every ``<prefix>.weight`` with a ``<prefix>.weight_scale`` is a quantized linear layer
    (:func:`dequantize_linear` with :data:`HF_UNIFIED_SCALES`); activation and KV-cache scales
    (``input_scale``, ``k_scale``, ``v_scale``) do not change weights and are dropped. Names stay the
    checkpoint's (the source model's own layout, MoE experts one by one), so ``from_pretrained`` maps them
    onto the model as it does the source's.

    Raises:
        StageError: no safetensors file, or a quantized tensor without its scale.
    """
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / "config.json").is_file():
        raise StageError(f"{ckpt_dir} is not a unified HF checkpoint: config.json is missing")
    info = CheckpointInfo.read_hf(ckpt_dir)
    tensors = _load_hf_tensors(ckpt_dir)
    sd: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if key.endswith(_HF_SCALE_SUFFIXES):
            continue
        prefix = key[:-len(".weight")] if key.endswith(".weight") else None
        if prefix is not None and f"{prefix}.weight_scale" in tensors:
            sd[key] = dequantize_linear(tensors, prefix, info.quant_algo, info.group_size, HF_UNIFIED_SCALES)
        elif t.dtype in (torch.int8, torch.uint8, torch.float8_e4m3fn):
            raise StageError(f"{ckpt_dir}: {key} is {t.dtype} without a weight_scale")
        else:
            sd[key] = t.float()
    if vocab_size is not None:
        for key in ("model.embed_tokens.weight", "lm_head.weight"):
            if key in sd:
                sd[key] = sd[key][:vocab_size]
    return sd, info


def read_checkpoint(ckpt_dir: str | Path, vocab_size: int | None = None
                    ) -> tuple[dict[str, torch.Tensor], CheckpointInfo]:
    """Either format, dequantized: rank shards (``rank0.safetensors``) are a TensorRT-LLM checkpoint, anything
    else a unified HF checkpoint. Returns (float32 state dict under HF names, info)."""
    if (Path(ckpt_dir) / "rank0.safetensors").is_file():
        return to_hf_state_dict(ckpt_dir, vocab_size)
    from builders.prequant import detect_folder
    from plugins.errors import SpecError

    try:
        pq = detect_folder(ckpt_dir)
    except SpecError:  # a ModelOpt recipe the source rules refuse: still ModelOpt's layout, read below
        pq = None
    if pq is not None and pq.method != "modelopt":
        return prequantized_state_dict(Path(ckpt_dir), pq, vocab_size)
    return hf_unified_state_dict(ckpt_dir, vocab_size)


def prequantized_state_dict(ckpt_dir: Path, pq, vocab_size: int | None = None
                            ) -> tuple[dict[str, torch.Tensor], CheckpointInfo]:
    """A compressed-tensors FP8, AutoAWQ or AutoGPTQ checkpoint (``pq``: builders.prequant.Prequantized) read back
    into float32 tensors under HF names (builders.prequant.dequantize_state_dict)."""
    from builders.prequant import dequantize_state_dict

    info = CheckpointInfo.read_hf(ckpt_dir)
    info = CheckpointInfo(**{**info.__dict__, "quant_algo": pq.quant_algo, "group_size": pq.group_size or 128,
                             "format": f"hf_{pq.method}", "kv_cache_quant_algo": pq.kv_cache_quant_algo})
    sd = dequantize_state_dict(_load_hf_tensors(ckpt_dir), pq)
    if vocab_size is not None:
        for key in ("model.embed_tokens.weight", "lm_head.weight"):
            if key in sd:
                sd[key] = sd[key][:vocab_size]
    return sd, info


def write_hf_folder(sd: dict[str, torch.Tensor], hf_dir: Path, out_dir: Path, dtype: torch.dtype,
                    tie_word_embeddings: bool) -> dict:
    """Save a dequantized state dict as an HF model folder: ``model.safetensors`` in ``dtype`` and the source's
    config.json (quantization_config removed, ``tie_word_embeddings`` as given: a tied lm_head is not written) and
    the Python files its ``auto_map`` needs (builders.model_fetch.copy_custom_code). ``from_pretrained(out_dir)``
    then loads it with the library's own name mapping. Returns the config written."""
    from safetensors.torch import save_file

    from builders.model_fetch import copy_custom_code

    hf_cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    if tie_word_embeddings:
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    hf_cfg["tie_word_embeddings"] = tie_word_embeddings
    hf_cfg.pop("quantization_config", None)
    hf_cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype).contiguous() for k, v in sd.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt", "source": "trtpipe dequantized checkpoint"})
    (out_dir / "config.json").write_text(json.dumps(hf_cfg, indent=2) + "\n")
    copy_custom_code(Path(hf_dir), out_dir)
    return hf_cfg


def keeps_tied(sd: dict[str, torch.Tensor], hf_config: dict, default: bool = False) -> bool:
    """Whether the served model ties lm_head to the embedding: the source does and the checkpoint's lm_head
    (when it has one) equals the embedding (a quantized or separately exported lm_head is kept)."""
    tied = bool(hf_config.get("tie_word_embeddings", default))
    lm, emb = sd.get("lm_head.weight"), sd.get("model.embed_tokens.weight")
    return tied and (lm is None or emb is None or torch.equal(lm, emb))


def write_dequantized(ckpt_dir: str | Path, hf_dir: Path, out_dir: Path, dtype: torch.dtype | None = None
                      ) -> tuple[CheckpointInfo, bool]:
    """Read ``ckpt_dir`` (either format, :func:`read_checkpoint`) and save it as an HF folder beside the source's
    config.json (:func:`write_hf_folder`), lm_head tied as :func:`keeps_tied` decides with the family's default.

    Args:
        dtype: of the saved tensors; None: the checkpoint's own 16-bit dtype.

    Returns:
        (the checkpoint's info, whether lm_head is tied).
    """
    from plugins.architectures import architecture

    hf_cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    sd, info = read_checkpoint(ckpt_dir, vocab_size=hf_cfg.get("vocab_size"))
    if hf_cfg.get("num_hidden_layers") != info.num_layers:
        raise StageError("checkpoint and source model disagree on num_hidden_layers: "
                         f"{info.num_layers} vs {hf_cfg.get('num_hidden_layers')}")
    if dtype is None:
        name = info.config.get("dtype") or info.config.get("torch_dtype") or "float16"
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(name, torch.float16)
    arch = architecture((hf_cfg.get("architectures") or [None])[0])
    tied = keeps_tied(sd, hf_cfg, arch.tie_default if arch else False)
    write_hf_folder(sd, Path(hf_dir), Path(out_dir), dtype, tied)
    return info, tied
