"""Pre-quantized checkpoints for the tests, each written the way its producer writes it.

* compressed-tensors FP8: by compressed-tensors itself (``apply_quantization_config``, its ``calculate_qparams`` for
  the scales, ``ModelCompressor.compress_model``, ``update_config``).
* ModelOpt: by the pipeline's own ModelOpt export (builders.quantize_hf).
* AutoAWQ GEMM and AutoGPTQ: AutoAWQ and AutoGPTQ need CUDA to build, so their layouts are written here from the
  rules recorded in tests/facts/quantized_formats.json (AutoAWQ 0.2.9 ``WQLinear_GEMM.from_linear``, AutoGPTQ 0.7
  ``QuantLinear.pack``): the AWQ files are checked against compressed-tensors' own AutoAWQ converter in
  tests/builders/test_prequant.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ 0.2.9 awq/modules/linear/gemm.py order_map
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja")


def copy_tokenizer(src: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(out) / name)


def quantized_linears(model) -> dict[str, torch.nn.Linear]:
    """The decoder's linear layers (lm_head and embeddings stay float, as every producer does by default)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}


def asym_int4(w: torch.Tensor, group_size: int, perm: torch.Tensor | None = None):
    """``w`` (out, in) -> (q (in, out) in [0, 15], scales (groups, out), zeros (groups, out) ints, g_idx (in,)):
    min/max asymmetric 4-bit per group of ``group_size`` inputs taken in ``perm`` order (desc_act)."""
    wt = w.detach().T.float()  # (in, out)
    n_in = wt.shape[0]
    order = perm if perm is not None else torch.arange(n_in)
    g_idx = torch.empty(n_in, dtype=torch.int32)
    g_idx[order] = (torch.arange(n_in) // group_size).to(torch.int32)
    groups = n_in // group_size
    scales = torch.empty(groups, wt.shape[1])
    zeros = torch.empty(groups, wt.shape[1])
    for g in range(groups):
        rows = wt[g_idx == g]
        lo, hi = rows.min(0).values.clamp(max=0), rows.max(0).values.clamp(min=0)
        s = ((hi - lo) / 15).clamp(min=1e-8)
        scales[g], zeros[g] = s, torch.round(-lo / s).clamp(0, 15)
    s16 = scales.half().float()
    q = torch.clamp(torch.round(wt / s16[g_idx.long()]) + zeros[g_idx.long()], 0, 15)
    return q.to(torch.int64), scales.half(), zeros.to(torch.int64), g_idx


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """(rows, out) ints in [0, 15] -> (rows, out/8) int32, nibble i = column 8c + AWQ_ORDER[i]."""
    rows, cols = values.shape
    v = values.reshape(rows, cols // 8, 8)
    words = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for i, c in enumerate(AWQ_ORDER):
        words |= v[..., c] << (4 * i)
    return _to_int32(words)


def pack_rows(values: torch.Tensor) -> torch.Tensor:
    """GPTQ qweight: (in, out) -> (in/8, out) int32, nibble i of row r = input 8r + i."""
    n_in, out = values.shape
    v = values.reshape(n_in // 8, 8, out)
    words = torch.zeros(n_in // 8, out, dtype=torch.int64)
    for i in range(8):
        words |= v[:, i, :] << (4 * i)
    return _to_int32(words)


def pack_cols(values: torch.Tensor) -> torch.Tensor:
    """GPTQ qzeros: (groups, out) -> (groups, out/8) int32, nibble i of word c = output 8c + i."""
    rows, cols = values.shape
    v = values.reshape(rows, cols // 8, 8)
    words = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for i in range(8):
        words |= v[..., i] << (4 * i)
    return _to_int32(words)


def _save(model, tensors: dict[str, torch.Tensor], out: Path, quantization_config: dict, tokenizer_src) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    cfg["architectures"] = [type(model).__name__]  # what the producers' save_pretrained writes
    cfg["torch_dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    if tokenizer_src is not None:
        copy_tokenizer(tokenizer_src, out)
    return out


def _float_rest(model, linears: dict) -> dict[str, torch.Tensor]:
    skip = tuple(f"{n}.weight" for n in linears)
    return {k: v.detach().half() for k, v in model.state_dict().items()
            if k not in skip and not (model.config.tie_word_embeddings and k == "lm_head.weight")}


def write_awq(model, out: Path, *, group_size: int = 32, tokenizer_src=None) -> Path:
    """An AutoAWQ GEMM checkpoint (4-bit, zero_point true) of ``model``."""
    linears = quantized_linears(model)
    tensors = _float_rest(model, linears)
    for name, lin in linears.items():
        q, s, z, _ = asym_int4(lin.weight, group_size)
        tensors[f"{name}.qweight"] = pack_awq(q)
        tensors[f"{name}.qzeros"] = pack_awq(z)
        tensors[f"{name}.scales"] = s
    return _save(model, tensors, out, {"quant_method": "awq", "bits": 4, "group_size": group_size,
                                       "zero_point": True, "version": "gemm", "modules_to_not_convert": None},
                 tokenizer_src)


def write_gptq(model, out: Path, *, group_size: int = 32, desc_act: bool = False, checkpoint_format: str = "gptq",
               tokenizer_src=None, seed: int = 0) -> Path:
    """An AutoGPTQ checkpoint (4-bit, sym false) of ``model``; ``desc_act``: groups over a random input order."""
    linears = quantized_linears(model)
    tensors = _float_rest(model, linears)
    gen = torch.Generator().manual_seed(seed)
    for name, lin in linears.items():
        perm = torch.randperm(lin.weight.shape[1], generator=gen) if desc_act else None
        q, s, z, g_idx = asym_int4(lin.weight, group_size, perm)
        tensors[f"{name}.qweight"] = pack_rows(q)
        tensors[f"{name}.qzeros"] = pack_cols(z - 1 if checkpoint_format == "gptq" else z)
        tensors[f"{name}.scales"] = s
        tensors[f"{name}.g_idx"] = g_idx
        if lin.bias is not None:
            tensors[f"{name}.bias"] = lin.bias.detach().half()
    return _save(model, tensors, out, {"quant_method": "gptq", "bits": 4, "group_size": group_size,
                                       "desc_act": desc_act, "sym": False, "true_sequential": True,
                                       "checkpoint_format": checkpoint_format}, tokenizer_src)


def reference_awq(model, group_size: int) -> dict[str, torch.Tensor]:
    """What the AWQ/GPTQ writers' integer grid means in float: ``(q - z) * s`` per layer, (out, in) float32."""
    out = {}
    for name, lin in quantized_linears(model).items():
        q, s, z, g = asym_int4(lin.weight, group_size)
        out[f"{name}.weight"] = ((q - z[g.long()]) * s.float()[g.long()]).T
    return out


def write_compressed_fp8(model, out: Path, *, strategy: str = "channel", block=(32, 32), tokenizer_src=None) -> Path:
    """A compressed-tensors FP8 checkpoint of ``model`` (weights only, ``strategy`` tensor, channel or block), made
    by compressed-tensors: its scales from its own ``calculate_qparams`` on each weight's min/max."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams

    extra = {"block_structure": list(block)} if strategy == "block" else {}
    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, dynamic=False, **extra)
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
                                ignore=["lm_head"], format="float-quantized")
    apply_quantization_config(model, config)
    for _, mod in model.named_modules():
        if not hasattr(mod, "weight_scale"):
            continue
        w = mod.weight.data
        if strategy == "channel":
            lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
        elif strategy == "tensor":
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)
        else:
            b0, b1 = block
            blocks = w.reshape(w.shape[0] // b0, b0, w.shape[1] // b1, b1)
            lo, hi = blocks.amin((1, 3)), blocks.amax((1, 3))
        scale, _ = calculate_qparams(lo, hi, args)
        mod.weight_scale.data = scale.reshape(mod.weight_scale.shape).to(mod.weight_scale.dtype)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    compressor.compress_model(model)
    out = Path(out)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    if tokenizer_src is not None:
        copy_tokenizer(tokenizer_src, out)
    return out
