"""Checkpoints that someone else already quantized: recognise them, plan them, read them back.

A source is pre-quantized when its ``config.json`` carries a ``quantization_config`` (or its folder an
``hf_quant_config.json``) of one of four producers:

* ModelOpt's unified HF export (``quant_method: "modelopt"`` in config.json, the recipe in
  ``hf_quant_config.json``; ModelOpt 0.47 ``modelopt/torch/export/unified_export_hf.py``): the format the
  ``trtllm-llmapi`` runtime's own build writes, read back by :func:`builders.checkpoint.hf_unified_state_dict`.
* compressed-tensors FP8 (``quant_method: "compressed-tensors"``, ``format: "float-quantized"``; compressed-tensors
  0.20 ``quantization/quant_scheme.py`` and ``compressors/quantized_compressors/fp8_quantized.py``): an
  ``float8_e4m3fn`` ``weight`` with a float ``weight_scale`` per tensor ``()``/``(1,)``, per output channel
  ``(out, 1)`` or per block ``(ceil(out/b0), ceil(in/b1))``.
* AutoAWQ GEMM (``quant_method: "awq"``, ``version: "gemm"``; AutoAWQ 0.2.9 ``awq/modules/linear/gemm.py``):
  ``qweight`` int32 ``(in, out/8)`` with the eight nibbles of a word holding outputs in the order
  ``0, 2, 4, 6, 1, 3, 5, 7``, ``qzeros`` int32 ``(in/g, out/8)`` packed the same way, ``scales`` float16
  ``(in/g, out)``; ``w = (q - z) * s``.
* AutoGPTQ / GPTQModel (``quant_method: "gptq"``; auto-gptq 0.7 ``nn_modules/qlinear/__init__.py``, GPTQModel
  ``checkpoint_format: "gptq"``): ``qweight`` int32 ``(in/8, out)`` packed along the input (nibble i of row r =
  input 8r+i), ``qzeros`` int32 ``(groups, out/8)`` packed along the output, stored as ``z - 1`` in the v1 format
  (``gptq``) and as ``z`` in ``gptq_v2``, ``scales`` float16 ``(groups, out)``, ``g_idx`` int32 ``(in,)`` the group
  of each input (a permutation when ``desc_act``); ``w = (q - z) * s[g_idx]``.

The layouts and keys are recorded in ``tests/facts/quantized_formats.json``; what each TensorRT-LLM path loads is in
``tests/facts/trtllm_1_2_1/prequantized.json`` and ``tests/facts/trtllm_1_4/prequantized.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    import torch

from plugins.errors import Problem, SpecError, StageError

FIELD = "model.source"

MODELOPT_RECIPES: dict[str | None, tuple[str, ...]] = {
    None: ("none",),  # unquantized weights with an FP8 KV cache
    "FP8": ("fp8",),
    "NVFP4": ("nvfp4",),
    "W4A16_AWQ": ("int4_awq", "int4_rtn", "int4_gptq"),
    "W4A8_AWQ": ("w4a8_awq",),
    "W8A8_SQ_PER_CHANNEL": ("int8_sq",),
}
"""ModelOpt ``hf_quant_config.json`` ``quantization.quant_algo`` -> the recipes of plugins.recipes that export it
(ModelOpt 0.47 ``modelopt/torch/export/model_config.py`` QUANTIZATION_* names); the first is the one adopted."""


@dataclass(frozen=True)
class Prequantized:
    """What a pre-quantized checkpoint says about its quantization.

    Attributes:
        method: the producer's ``quant_method``: ``modelopt``, ``compressed-tensors``, ``awq`` or ``gptq``.
        quant_algo: the TensorRT-LLM ``QuantAlgo`` name of the format (``FP8``, ``FP8_PER_CHANNEL_PER_TOKEN``,
            ``FP8_BLOCK_SCALES``, ``NVFP4``, ``W4A16_AWQ``, ``W4A8_AWQ``, ``W8A8_SQ_PER_CHANNEL``, ``W4A16_GPTQ``;
            tensorrt_llm/quantization/mode.py QuantAlgo, 1.2.1).
        recipes: the recipes of plugins.recipes that write the same weight format (the build file's
            ``quantization.quant_algo`` may name any of them; the first is adopted when it names none).
        group_size: INT4 group size along the input (None: not a grouped format, or not known from config.json).
        kv_cache_quant_algo: ``fp8`` when the checkpoint carries FP8 KV-cache scales, else None.
        detail: format details: ``strategy`` (compressed-tensors), ``zero_point``, ``desc_act``, ``sym``,
            ``version``/``checkpoint_format``, ``producer``.
        declared_in: the file that declares it (``hf_quant_config.json`` or ``config.json``).
    """

    method: str
    quant_algo: str
    recipes: tuple[str, ...]
    group_size: Optional[int] = None
    kv_cache_quant_algo: Optional[str] = None
    detail: dict = field(default_factory=dict)
    declared_in: str = "config.json"

    @property
    def recipe(self) -> str:
        """The recipe adopted when the build file names none."""
        return self.recipes[0]

    def record(self) -> dict:
        """JSON for plan.json, the manifest and verify.json."""
        out = asdict(self)
        out["recipes"] = list(self.recipes)
        return out

    @classmethod
    def from_record(cls, record: dict) -> "Prequantized":
        """The inverse of :meth:`record` (plan.json's ``source_quantization``)."""
        return cls(**{**record, "recipes": tuple(record["recipes"])})

    quantized = True

    def linear_bytes(self, n_in: int, n_out: int, group_size: int, dtype_bytes: int) -> tuple[int, int]:
        """(weight bytes, scale bytes) of one ``n_in x n_out`` linear layer shard as the TensorRT-LLM runtimes hold
        this checkpoint (the interface of plugins.recipes.QuantRecipe.linear_bytes, for builders.plan).

        AutoAWQ/AutoGPTQ (W4A16_GPTQ): 0.5 B/param + a 16-bit scale and a 16-bit zero per group of ``group_size``
        inputs per output (``weights_scaling_factor``, ``zero``: TensorRT-LLM's checkpoint format). compressed-tensors
        FP8: 1 B/param + a ``weight_scale`` per tensor, per output channel or per block, in the model's dtype (as
        compressed-tensors 0.20 writes it; tests/facts/quantized_formats.json). ModelOpt: its recipe's layout
        (plugins.recipes)."""
        from plugins.recipes import QUANT_RECIPES

        if self.method == "modelopt":
            return QUANT_RECIPES[self.recipe].linear_bytes(n_in, n_out, group_size, dtype_bytes)
        if self.method in ("awq", "gptq"):
            groups = -(-n_in // self.group_size) if self.group_size else 1
            return n_in * n_out // 2, 2 * groups * n_out * dtype_bytes
        strategy = self.detail.get("strategy")
        if strategy == "channel":
            scales = n_out
        elif strategy == "block":
            b0, b1 = self.detail.get("block_structure") or (128, 128)
            scales = -(-n_out // b0) * -(-n_in // b1)
        else:
            scales = 1
        static_input = (self.detail.get("input_activations") or {}).get("dynamic") is False
        return n_in * n_out, (scales + (1 if static_input else 0)) * dtype_bytes

    def describe(self) -> str:
        """One phrase: ``AutoGPTQ W4A16_GPTQ (group 128, desc_act false, sym true)``."""
        names = {"modelopt": "ModelOpt", "compressed-tensors": "compressed-tensors", "awq": "AutoAWQ",
                 "gptq": "AutoGPTQ"}
        bits = [f"group {self.group_size}"] if self.group_size else []
        bits += [f"{k} {json.dumps(v)}" for k, v in self.detail.items() if k in ("strategy", "desc_act", "sym")]
        what = self.quant_algo or f"unquantized weights, {self.kv_cache_quant_algo} KV cache"
        return f"{names[self.method]} {what}" + (f" ({', '.join(bits)})" if bits else "")


def _problem(where: str, rule: str, fix: str, code: str = "prequant_format") -> SpecError:
    return SpecError([Problem(FIELD, where, rule, fix, code=code)])


UNQUANTIZED_FIX = ("use the checkpoint's unquantized original (and let trtpipe quantize it: quantization.quant_algo), "
                   "or a ModelOpt, compressed-tensors FP8, AutoAWQ or AutoGPTQ checkpoint")


def detect(hf_config: dict, folder: Path | str | None = None) -> Prequantized | None:
    """The quantization of a checkpoint from its config.json (``hf_config``) and, when ``folder`` is given and has
    one, its ``hf_quant_config.json``; None for an unquantized checkpoint.

    Raises:
        SpecError: a quantization trtpipe does not read (another ``quant_method``, or a variant of one of the four:
            AWQ other than GEMM, GPTQ other than 4-bit, compressed-tensors other than FP8, a ModelOpt quant_algo
            without a recipe here), naming it and the fix (code ``prequant_format``).
    """
    where = str(hf_config.get("_name_or_path") or folder or "config.json")
    if folder is None and hf_config.get("_name_or_path") and Path(str(hf_config["_name_or_path"])).is_dir():
        folder = hf_config["_name_or_path"]  # a local folder's config.json: its hf_quant_config.json is beside it
    hq_path = Path(folder) / "hf_quant_config.json" if folder is not None else None
    hq = None
    if hq_path is not None and hq_path.is_file():
        try:
            hq = json.loads(hq_path.read_text())
        except (OSError, ValueError) as exc:
            raise _problem(str(hq_path), f"hf_quant_config.json is unreadable ({exc})",
                           "restore the file from the checkpoint's original") from exc
    qc = hf_config.get("quantization_config")
    if hq is None and not isinstance(qc, dict):
        return None
    method = str((qc or {}).get("quant_method") or ("modelopt" if hq is not None else "")).lower()
    if hq is not None or method == "modelopt":
        return _modelopt(hq, qc or {}, where)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where)
    if method == "awq":
        return _awq(qc, where)
    if method == "gptq":
        return _gptq(qc, where)
    raise _problem(where, f"config.json quantization_config has quant_method {method or None!r}, a quantization "
                   "trtpipe does not read (it reads ModelOpt, compressed-tensors FP8, AutoAWQ GEMM and AutoGPTQ "
                   "4-bit checkpoints)", UNQUANTIZED_FIX)


def _modelopt(hq: dict | None, qc: dict, where: str) -> Prequantized:
    q = (hq or {}).get("quantization") or qc
    algo = q.get("quant_algo")
    kv = q.get("kv_cache_quant_algo") or qc.get("kv_cache_quant_algo")
    if algo not in MODELOPT_RECIPES:
        raise _problem(where, f"ModelOpt quant_algo {algo!r} is not one trtpipe reads "
                       f"({', '.join(str(k) for k in MODELOPT_RECIPES)})", UNQUANTIZED_FIX)
    if algo is None and kv is None:
        return None  # a ModelOpt export that quantized nothing
    if kv not in (None, "FP8"):
        raise _problem(where, f"ModelOpt kv_cache_quant_algo {kv!r} is not one trtpipe reads (FP8 or none)",
                       UNQUANTIZED_FIX)
    producer = (hq or {}).get("producer") or qc.get("producer") or {}
    return Prequantized("modelopt", algo, _known(MODELOPT_RECIPES[algo]), group_size=q.get("group_size"),
                        kv_cache_quant_algo="fp8" if kv == "FP8" else None,
                        detail={"producer": f"{producer.get('name', '?')} {producer.get('version', '?')}",
                                **({"exclude_modules": q.get("exclude_modules") or q.get("ignore")}
                                   if q.get("exclude_modules") or q.get("ignore") else {})},
                        declared_in="hf_quant_config.json" if hq is not None else "config.json")


def _compressed_tensors(qc: dict, where: str) -> Prequantized:
    groups = qc.get("config_groups") or {}
    weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
    fmt = qc.get("format")
    formats = {fmt} | {g.get("format") for g in groups.values() if isinstance(g, dict) and g.get("format")}
    formats.discard(None)
    fp8 = weights and all(w.get("num_bits") == 8 and w.get("type") == "float" for w in weights)
    if not fp8 or not formats <= {"float-quantized"}:
        seen = sorted({f"{w.get('type')} {w.get('num_bits')}-bit" for w in weights})
        raise _problem(where, f"compressed-tensors checkpoint with weights {', '.join(seen) or 'none'} in format "
                       f"{', '.join(sorted(formats)) or '?'}: trtpipe reads its FP8 checkpoints only "
                       "(float-quantized, 8-bit float weights)", UNQUANTIZED_FIX)
    strategies = sorted({w.get("strategy") or "tensor" for w in weights})
    if len(strategies) != 1 or strategies[0] not in ("tensor", "channel", "block"):
        raise _problem(where, f"compressed-tensors FP8 weight strategies {strategies}: trtpipe reads one of tensor, "
                       "channel or block per checkpoint", UNQUANTIZED_FIX)
    strategy = strategies[0]
    algo = {"tensor": "FP8", "channel": "FP8_PER_CHANNEL_PER_TOKEN", "block": "FP8_BLOCK_SCALES"}[strategy]
    detail: dict = {"strategy": strategy, "format": "float-quantized"}
    blocks = [w.get("block_structure") for w in weights if w.get("block_structure")]
    if blocks:
        detail["block_structure"] = blocks[0]
    acts = [g.get("input_activations") for g in groups.values() if isinstance(g, dict) and g.get("input_activations")]
    if acts:
        detail["input_activations"] = {k: acts[0].get(k) for k in ("strategy", "dynamic") if k in acts[0]}
    if qc.get("ignore"):
        detail["ignore"] = qc["ignore"]
    kv = qc.get("kv_cache_scheme")
    return Prequantized("compressed-tensors", algo, _known(("fp8",)), detail=detail,
                        kv_cache_quant_algo="fp8" if isinstance(kv, dict) and kv.get("type") == "float" else None)


def _awq(qc: dict, where: str) -> Prequantized:
    bits = qc.get("bits", qc.get("w_bit"))
    version = str(qc.get("version") or "gemm").lower()
    if bits != 4 or version != "gemm":
        raise _problem(where, f"AutoAWQ checkpoint with bits {bits}, version {version!r}: trtpipe reads 4-bit GEMM "
                       "checkpoints (version \"gemm\", AutoAWQ's default)", UNQUANTIZED_FIX)
    # TensorRT-LLM's name for asymmetric INT4 with zero points: AutoAWQ loads as W4A16_GPTQ with use_autoawq
    # (tests/facts/trtllm_1_2_1/prequantized.json engine_path.hf_quantization_config_route)
    return Prequantized("awq", "W4A16_GPTQ", _known(("int4_awq",)),
                        group_size=int(qc.get("group_size", qc.get("q_group_size", 128))),
                        detail={"zero_point": bool(qc.get("zero_point", True)), "version": version,
                                **({"modules_to_not_convert": qc["modules_to_not_convert"]}
                                   if qc.get("modules_to_not_convert") else {})})


def _gptq(qc: dict, where: str) -> Prequantized:
    bits = qc.get("bits")
    fmt = str(qc.get("checkpoint_format") or "gptq").lower()
    if bits != 4 or fmt not in ("gptq", "gptq_v2"):
        raise _problem(where, f"GPTQ checkpoint with bits {bits}, checkpoint_format {fmt!r}: trtpipe reads 4-bit "
                       "GPTQ checkpoints in the gptq or gptq_v2 format", UNQUANTIZED_FIX)
    group = int(qc.get("group_size", 128))  # -1: one group over every input (per output channel)
    return Prequantized("gptq", "W4A16_GPTQ", _known(("int4_gptq",)), group_size=group if group > 0 else None,
                        detail={"desc_act": bool(qc.get("desc_act", False)), "sym": bool(qc.get("sym", True)),
                                "checkpoint_format": fmt})


def _known(recipes: tuple[str, ...]) -> tuple[str, ...]:
    from plugins.recipes import QUANT_RECIPES

    # int4_gptq is the recipe of GPTQ; where the registry lacks it, int4_awq plans the same INT4 bytes
    known = tuple(r for r in recipes if r in QUANT_RECIPES)
    return known or ("int4_awq",)


def detect_folder(folder: Path | str) -> Prequantized | None:
    """:func:`detect` on ``folder``'s config.json and hf_quant_config.json (None without a config.json)."""
    from builders.model_fetch import folder_config

    cfg = folder_config(folder)
    return detect(cfg, folder) if cfg is not None else None


# ---------------------------------------------------------------------------------------------------------------
# reading the weights back (float32, dequantized, HF names)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ GEMM: nibble i (bits 4i..4i+3) of a packed int32 holds output column ``8 * word + AWQ_ORDER[i]``
(AutoAWQ 0.2.9 ``awq/modules/linear/gemm.py`` WQLinear_GEMM.from_linear ``order_map``)."""


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``(..., n)`` int32 words -> ``(..., n, 8)`` unsigned 4-bit values, nibble i = bits 4i..4i+3."""
    import torch

    p = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    return (p.unsqueeze(-1) >> shifts) & 0xF


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """AutoAWQ GEMM words ``(rows, out/8)`` int32 -> ``(rows, out)`` int64 values in [0, 15] (AWQ_ORDER undone)."""
    import torch

    nib = _nibbles(packed)  # (rows, words, 8): nibble i holds column AWQ_ORDER[i] of the word's eight
    inverse = [AWQ_ORDER.index(c) for c in range(8)]
    return nib[..., inverse].reshape(packed.shape[0], -1)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """GPTQ ``qweight`` ``(in/8, out)`` int32 -> ``(in, out)`` values in [0, 15] (nibble i of row r = input 8r+i)."""
    import torch

    nib = _nibbles(packed)  # (in/8, out, 8)
    return nib.permute(0, 2, 1).reshape(-1, packed.shape[1])


def unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """GPTQ ``qzeros`` ``(groups, out/8)`` int32 -> ``(groups, out)`` values (nibble i of word c = output 8c+i)."""
    import torch

    return _nibbles(packed).reshape(packed.shape[0], -1)


def dequantize_awq(t: dict[str, torch.Tensor], prefix: str, group_size: int, zero_point: bool = True
                   ) -> torch.Tensor:
    """One AutoAWQ GEMM linear layer -> float32 ``(out, in)``: ``(q - z) * s`` per group of ``group_size`` inputs
    (without zero points: ``(q - 8) * s``)."""
    import torch

    q = unpack_awq(t[f"{prefix}.qweight"]).float()  # (in, out)
    s = t[f"{prefix}.scales"].float()  # (in/g, out)
    z = unpack_awq(t[f"{prefix}.qzeros"]).float() if zero_point and f"{prefix}.qzeros" in t else torch.full_like(s, 8)
    n_in = q.shape[0]
    groups = torch.arange(n_in) // group_size
    return ((q - z[groups, :q.shape[1]]) * s[groups, :q.shape[1]]).T.contiguous()


def dequantize_gptq(t: dict[str, torch.Tensor], prefix: str, group_size: int | None,
                    checkpoint_format: str = "gptq") -> torch.Tensor:
    """One GPTQ linear layer -> float32 ``(out, in)``: ``(q - z) * s[g_idx]``, ``z`` stored minus one in the v1
    ``gptq`` format; ``g_idx`` absent: ``i // group_size`` (``group_size`` None: one group)."""
    import torch

    q = unpack_rows(t[f"{prefix}.qweight"]).float()  # (in, out)
    s = t[f"{prefix}.scales"].float()  # (groups, out)
    z = unpack_cols(t[f"{prefix}.qzeros"]).float()[:, :q.shape[1]]
    if checkpoint_format == "gptq":
        z = z + 1
    g = t.get(f"{prefix}.g_idx")
    if g is not None:
        groups = g.long()
    else:
        groups = torch.arange(q.shape[0]) // group_size if group_size else torch.zeros(q.shape[0], dtype=torch.long)
    return ((q - z[groups]) * s[groups]).T.contiguous()


def dequantize_fp8(t: dict[str, torch.Tensor], prefix: str, block: list[int] | None = None) -> torch.Tensor:
    """One compressed-tensors FP8 linear layer -> float32 ``(out, in)``: ``weight * weight_scale`` with the scale per
    tensor, per output channel ``(out, 1)`` or per ``block`` = ``[b0, b1]`` (``block_structure``) of
    ``(ceil(out/b0), ceil(in/b1))`` scales."""
    import torch

    w = t[f"{prefix}.weight"].float()
    s = t[f"{prefix}.weight_scale"].float()
    if s.numel() == 1:
        return w * s.reshape(())
    if s.dim() == 2 and s.shape == (w.shape[0], 1):
        return w * s
    b0, b1 = block or (-(-w.shape[0] // s.shape[0]), -(-w.shape[1] // s.shape[1]))
    s = s.repeat_interleave(b0, 0).repeat_interleave(b1, 1)[:w.shape[0], :w.shape[1]]
    return w * s


_DROPPED = (".input_scale", ".k_scale", ".v_scale", ".weight_zero_point", ".input_zero_point", ".output_scale",
            ".kv_scale", ".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_shape")


def dequantized_names(method: str, names) -> dict[str, str]:
    """Checkpoint tensor name -> the HF name it becomes when read back (``<prefix>.qweight`` -> ``<prefix>.weight``);
    scale, zero-point and index tensors map to nothing (absent from the result)."""
    out = {}
    for n in names:
        if method in ("awq", "gptq") and n.endswith(".qweight"):
            out[n] = n[:-len(".qweight")] + ".weight"
        elif n.endswith(_DROPPED) and method in ("awq", "gptq", "compressed-tensors"):
            continue
        else:
            out[n] = n
    return out


def dequantize_state_dict(tensors: dict[str, torch.Tensor], pq: Prequantized) -> dict[str, torch.Tensor]:
    """A compressed-tensors, AutoAWQ or AutoGPTQ checkpoint's tensors -> float32 state dict under HF names.

    Raises:
        StageError: a quantized tensor without its scales.
    """
    import torch

    sd: dict[str, torch.Tensor] = {}
    for name, target in dequantized_names(pq.method, tensors).items():
        prefix = target[:-len(".weight")] if target.endswith(".weight") else None
        try:
            if pq.method == "awq" and name.endswith(".qweight"):
                sd[target] = dequantize_awq(tensors, prefix, pq.group_size or 128, pq.detail.get("zero_point", True))
            elif pq.method == "gptq" and name.endswith(".qweight"):
                sd[target] = dequantize_gptq(tensors, prefix, pq.group_size,
                                             pq.detail.get("checkpoint_format", "gptq"))
            elif pq.method == "compressed-tensors" and tensors[name].dtype == torch.float8_e4m3fn:
                sd[target] = dequantize_fp8(tensors, prefix, pq.detail.get("block_structure"))
            else:
                sd[target] = tensors[name].float()
        except KeyError as exc:
            raise StageError(f"{name}: the {pq.describe()} checkpoint lacks {exc.args[0]}, which reading this layer "
                             "needs (a partial download or another format's file)") from exc
    return sd


# ---------------------------------------------------------------------------------------------------------------
# the build file against the checkpoint

def source_quantization(build, hf_config: dict | None, folder: Path | str | None = None):
    """``build`` with the quantization of a pre-quantized source adopted, and that quantization.

    The build file's ``quantization.quant_algo`` (when written) must name a recipe of the checkpoint's format, its
    ``group_size`` (when written) the checkpoint's; what it leaves out is taken from the checkpoint. The quantize
    stage then does not run (pipeline.build.checkpoint_stage): nothing is quantized twice.

    Args:
        build: builders.spec.ResolvedBuild.
        hf_config: the source's config.json (None: not readable yet, e.g. an embedded model before conversion).
        folder: the source folder, when it is local (its hf_quant_config.json is read too).

    Returns:
        ``(build, Prequantized)``; ``(build, None)`` unchanged for an unquantized source.

    Raises:
        SpecError: every disagreement at once (codes ``prequant_recipe``, ``prequant_group_size``,
            ``prequant_kv_cache``, ``reference_unquantized``), and :func:`detect`'s.
    """
    pq = detect(hf_config, folder) if hf_config is not None else None
    problems: list[Problem] = []
    if pq is None:
        if build.model.reference and hf_config is not None:
            problems.append(Problem("model.reference", build.model.reference, "a reference is the unquantized "
                                    "model a pre-quantized model.source was made from; this source is not quantized, "
                                    "and verify compares the build with it already",
                                    "remove model.reference", code="reference_unquantized"))
        if problems:
            raise SpecError(problems, build.spec_path)
        return build, None
    q = build.settings.quantization
    written = q.model_fields_set
    where = f"{build.model.source} ({pq.declared_in})"
    if "quant_algo" in written and q.quant_algo not in pq.recipes:
        problems.append(Problem(build.where("quantization.quant_algo"), q.quant_algo,
                                f"model.source is already quantized: {pq.describe()}, read from {where}; trtpipe does "
                                "not quantize a quantized checkpoint again",
                                f"remove quantization.quant_algo (the checkpoint's is used) or set it to "
                                f"{' or '.join(pq.recipes)}; to quantize with {q.quant_algo}, point model.source at the "
                                "unquantized model", code="prequant_recipe"))
    if "group_size" in written and pq.group_size and q.group_size != pq.group_size:
        problems.append(Problem(build.where("quantization.group_size"), q.group_size,
                                f"the pre-quantized checkpoint's group size is {pq.group_size} ({where})",
                                f"remove quantization.group_size or set it to {pq.group_size}",
                                code="prequant_group_size"))
    if "kv_cache_quant_algo" in written and q.kv_cache_quant_algo != pq.kv_cache_quant_algo:
        rule = (f"the pre-quantized checkpoint's KV cache is {pq.kv_cache_quant_algo} ({where}), with the KV-cache "
                "scales its producer calibrated" if pq.kv_cache_quant_algo else
                f"the pre-quantized checkpoint has no KV-cache scales ({where}): its KV cache is the model dtype")
        problems.append(Problem(build.where("quantization.kv_cache_quant_algo"), q.kv_cache_quant_algo, rule,
                                "remove quantization.kv_cache_quant_algo" + (f" or set it to {pq.kv_cache_quant_algo}"
                                                                            if pq.kv_cache_quant_algo else ""),
                                code="prequant_kv_cache"))
    if problems:
        raise SpecError(problems, build.spec_path)
    return adopt(build, pq), pq


def adopt(build, pq: Prequantized):
    """``build`` with ``pq``'s quantization (its recipe unless the build file names another of its recipes, its group
    size, its KV-cache quantization), whatever the build file says otherwise: what the other rules judge once the
    disagreements are reported (builders.preflight.make_plan), so they do not add problems of a recipe that will not
    be built."""
    q = build.settings.quantization
    written = q.model_fields_set
    update = {"quant_algo": q.quant_algo if "quant_algo" in written and q.quant_algo in pq.recipes else pq.recipe,
              "kv_cache_quant_algo": pq.kv_cache_quant_algo}
    if pq.group_size:
        update["group_size"] = pq.group_size
    settings = build.settings.model_copy(update={"quantization": q.model_copy(update=update)})
    return build.model_copy(update={"settings": settings})


LLMAPI_MODELOPT = (None, "FP8", "NVFP4", "W4A16_AWQ", "W4A8_AWQ")
"""ModelOpt quant_algo values TensorRT-LLM's PyTorch backend loads from hf_quant_config.json (1.2.1 and 1.4
``tensorrt_llm/_torch/model_config.py``; W8A8_SQ_PER_CHANNEL is read there but refused by ``_torch/modules/linear.py``).
Recorded in tests/facts/trtllm_1_2_1/prequantized.json and tests/facts/trtllm_1_4/prequantized.json."""


def runtime_problems(build, pq: Prequantized | None, hf_config: dict | None = None) -> list[Problem]:
    """Where ``build.settings.runtime`` cannot serve the pre-quantized source ``pq`` as upstream reads it, one
    Problem naming the runtime that can (code ``prequant_runtime``); [] where it can or ``pq`` is None.

    The portable runtime reads all four formats (dequantized on the CPU). TensorRT-LLM (facts:
    tests/facts/trtllm_1_2_1/prequantized.json, tests/facts/trtllm_1_4/prequantized.json):

    * PyTorch backend (``trtllm-llmapi``): ModelOpt :data:`LLMAPI_MODELOPT`; compressed-tensors FP8 with channel
      weights and per-token activations (``FP8_PER_CHANNEL_PER_TOKEN``) or 128 x 128 block weights and group-128
      activations (``FP8_BLOCK_SCALES``; 1.4 ``_torch/model_config.py``), never per-tensor; no AutoAWQ or AutoGPTQ
      (``llmapi/llm_utils.py``: ``NotImplementedError("Unsupported quantization_config")``).
    * Engine path (``trtllm``, 1.2.1): builds from TensorRT-LLM checkpoints, not from ModelOpt's HF export or
      compressed-tensors. AutoAWQ and AutoGPTQ (v1 ``gptq`` format, ``desc_act`` false) of the dense Llama and Qwen
      families convert through upstream's ``from_hugging_face`` (builders.prequant_trtllm); upstream refuses
      ``desc_act`` true and reads zero points the v1 way only.
    """
    if pq is None or build.settings.runtime == "pytorch":
        return []
    field = build.where("runtime")
    rt = build.settings.runtime
    what = pq.describe()

    def refuse(rule: str, fix: str) -> list[Problem]:
        return [Problem(field, rt, f"model.source is pre-quantized ({what}): {rule}", fix, code="prequant_runtime")]

    portable = "runtime: pytorch serves it (dequantized)"
    if build.runtime.llm_api:
        if pq.method == "modelopt" and pq.quant_algo not in LLMAPI_MODELOPT:
            return refuse(f"TensorRT-LLM's PyTorch backend reads ModelOpt "
                          f"{', '.join(str(a) for a in LLMAPI_MODELOPT if a)} checkpoints, "
                          f"not {pq.quant_algo} (_torch/modules/linear.py: unsupported quant mode)",
                          f"{portable}; or build from the unquantized model with another quant_algo")
        if pq.method == "compressed-tensors":
            act = pq.detail.get("input_activations") or {}
            ok = (pq.detail["strategy"] == "channel" and act.get("strategy") == "token") or \
                 (pq.detail["strategy"] == "block" and pq.detail.get("block_structure") in (None, [128, 128])
                  and act.get("strategy") == "group")
            if not ok:
                return refuse("TensorRT-LLM's PyTorch backend reads compressed-tensors FP8 with channel weights and "
                              "token activations (FP8_DYNAMIC) or [128, 128] block weights and group-128 activations "
                              f"(FP8_BLOCK), not {pq.detail['strategy']} weights with "
                              f"{act.get('strategy') or 'no'} activations (_torch/model_config.py)",
                              f"{portable}; or use the checkpoint's FP8_DYNAMIC or FP8_BLOCK variant")
        if pq.method in ("awq", "gptq"):
            return refuse(f"TensorRT-LLM's PyTorch backend (1.2.1, 1.4) has no {pq.method.upper()} reader "
                          "(llmapi/llm_utils.py: Unsupported quantization_config)",
                          f"{portable}" + ("; runtime: trtllm converts it (desc_act false)"
                                           if pq.method == "gptq" and not pq.detail.get("desc_act") else "")
                          + "; or quantize the unquantized model with quant_algo int4_awq")
        return []
    if build.runtime.builds_trt_engine:
        if pq.method in ("awq", "gptq"):
            from builders.prequant_trtllm import ENGINE_CLASSES
            from plugins.architectures import architecture

            cfg = hf_config or {}
            arch = architecture((cfg.get("architectures") or [None])[0])
            decoder = build.model.decoder_type or (arch.decoder_type if arch else None)
            if pq.detail.get("desc_act"):
                return refuse("TensorRT-LLM 1.2.1's engine path refuses GPTQ with desc_act true (convert_checkpoint.py"
                              " update_quant_config_from_hf: not implemented)",
                              f"{portable}; or use a desc_act false checkpoint")
            if pq.detail.get("checkpoint_format") == "gptq_v2":
                return refuse("TensorRT-LLM 1.2.1's engine path reads GPTQ zero points in the v1 gptq format only "
                              "(llama/convert.py: zero = (8 - 1 - qzeros) * scales)", f"{portable}; or use the gptq (v1) format")
            if arch is not None and (decoder not in ENGINE_CLASSES or arch.moe is not None):
                return refuse(f"TensorRT-LLM 1.2.1's engine path converts AutoAWQ/AutoGPTQ folders of the dense Llama "
                              f"and Qwen families (from_hugging_face with use_autoawq), not {arch.family}",
                              f"{portable}")
            return []
        instead = "runtime: trtllm-llmapi reads it" if not runtime_problems(
            build.model_copy(update={"settings": build.settings.model_copy(update={"runtime": "trtllm-llmapi"})}),
            pq) else portable
        return refuse("TensorRT-LLM 1.2.1's engine path builds from TensorRT-LLM checkpoints (ModelOpt's "
                      "export_tensorrt_llm_checkpoint, or its convert_checkpoint.py for GPTQ), not from this format",
                      f"{instead}; or build from the unquantized model")
    return []


_MODELOPT_DROPPED = (".weight_scale", ".weight_scale_2", ".pre_quant_scale", ".input_scale", ".k_scale", ".v_scale")


def float_headers(pq: Prequantized, tensors: dict[str, tuple[tuple[int, ...], str, str]]
                  ) -> dict[str, tuple[tuple[int, ...], str, str]]:
    """A pre-quantized checkpoint's safetensors headers (name -> (shape, dtype, file); builders.source_tensors
    .read_headers) as the float tensors they are read back as: packed INT4 and FP4 weights at their ``(out, in)``
    shape, scales, zero points and indices dropped; nothing is read but the headers."""
    out = {}
    for name, (shape, dtype, file) in tensors.items():
        if pq.method == "modelopt":
            if name.endswith(_MODELOPT_DROPPED):
                continue
            prefix = name[:-len(".weight")] if name.endswith(".weight") else None
            if prefix is not None and f"{prefix}.weight_scale" in tensors and dtype == "U8" and len(shape) == 2:
                # INT4: two values per byte along the output; NVFP4: two along the input
                shape = (shape[0], shape[1] * 2) if pq.quant_algo == "NVFP4" else (shape[0] * 2, shape[1])
            out[name] = (tuple(shape), "F16" if prefix and f"{prefix}.weight_scale" in tensors else dtype, file)
            continue
        targets = dequantized_names(pq.method, [name])
        if name not in targets:
            continue
        if name.endswith(".qweight") and len(shape) == 2:
            n_in, n_out = (shape[0], shape[1] * 8) if pq.method == "awq" else (shape[0] * 8, shape[1])
            out[targets[name]] = ((n_out, n_in), "F16", file)
        else:
            out[targets[name]] = (tuple(shape), "F16" if dtype == "F8_E4M3" else dtype, file)
    return out
