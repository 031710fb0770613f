"""Quantization recipes: the registry every stage and rule asks, by trait, never by name.

Each :class:`QuantRecipe` owns what a rule needs to know about it: the ModelOpt config that
produces it, the ``quantization.quant_algo`` the TensorRT-LLM checkpoint records, the bytes of
its weights and scales, and the hardware it needs. Adding a recipe is adding one entry to
:data:`QUANT_RECIPES`: the spec's ``quant_algo`` choices are its keys.

Sources: ModelOpt 0.47 ``modelopt/torch/quantization/config.py`` (the ``*_CFG`` names) and
``modelopt/torch/export/model_config.py`` (the ``QUANTIZATION_*`` names), ``GPTQCalibConfig`` in the same
``config.py`` and ``gptq`` in ``modelopt/torch/quantization/model_calib.py`` (int4_gptq); TensorRT-LLM 1.2
``tensorrt_llm/quantization/mode.py`` (QuantAlgo) and ``tensorrt_llm/builder.py`` (which
algorithms get FP8 context FMHA); the scale layouts follow TensorRT-LLM's checkpoint format
(``docs/source/architecture/checkpoint.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class QuantRecipe:
    """One quantization recipe.

    Attributes:
        name: our key (``fp8``, ``int4_awq``...), the spec's ``quantization.quant_algo``.
        modelopt_cfg: name of the ModelOpt config in ``modelopt.torch.quantization`` (None: no quantization).
        algorithm: ModelOpt calibration algorithm that replaces the config's own ``algorithm`` (a key of
            :data:`ALGORITHMS`; None: the config's, e.g. ``max`` or ``awq_lite``). ``gptq`` turns the round-to-nearest
            INT4 block-wise config into GPTQ (int4_gptq).
        quant_algo: TensorRT-LLM ``quantization.quant_algo`` written in the checkpoint (None: unquantized).
        weight_bits: bits per weight of quantized linear layers.
        uses_group_size: whether ``group_size`` applies (INT4 block-wise recipes).
        needs_calibration_data: whether ModelOpt runs a forward loop.
        fp8_compute: FP8 tensor-core GEMMs or activations (needs SM >= 89; may use FP8 context FMHA).
        int_weight_gemm: INT4/INT8 weight-only or SmoothQuant GEMM kernels (refused by trtllm-build 1.2 on
            SM 100-119).
        per_channel_scales: one FP32 scale per output channel (SmoothQuant, INT8 weight-only) instead of
            per-tensor scales.
        smoothquant: INT8 activations too (SmoothQuant's INT8 GEMM and quantized RMSNorm), not weight-only.
        fused_mlp: trtllm-build keeps the gate+up GEMM fusion (unquantized and FP8 only).
        fp4_compute: FP4 tensor-core GEMMs (NVFP4: needs SM >= 100, Blackwell).
        block_size: a fixed scale block along the input (NVFP4: one FP8 scale per 16 inputs), 0 when none.
        checkpoint_formats: the checkpoint formats the pipeline writes and reads back for it (NVFP4: the unified
            HF checkpoint only; builders/checkpoint.py reads no FP4 TensorRT-LLM checkpoint).
        aiconfigurator_gemm, aiconfigurator_moe: NVIDIA aiconfigurator 0.12's ``GEMMQuantMode`` / ``MoEQuantMode``
            that models the recipe's dense and expert GEMMs (``aiconfigurator_core/sdk/common.py``); None: it has
            none, and the plan makes no prediction. FP8 is ``fp8_static``: ModelOpt's FP8 has static per-tensor
            activation scales, the mode aiconfigurator itself infers for ModelOpt FP8 checkpoints
            (``sdk/models/helpers.py`` ``_infer_quant_modes_from_raw_config``).
    """

    name: str
    modelopt_cfg: Optional[str]
    quant_algo: Optional[str]
    weight_bits: int
    algorithm: Optional[str] = None
    uses_group_size: bool = False
    needs_calibration_data: bool = True
    fp8_compute: bool = False
    int_weight_gemm: bool = False
    per_channel_scales: bool = False
    smoothquant: bool = False
    fused_mlp: bool = False
    fp4_compute: bool = False
    block_size: int = 0
    checkpoint_formats: tuple[str, ...] = ("trtllm", "hf_unified")
    aiconfigurator_gemm: Optional[str] = None
    aiconfigurator_moe: Optional[str] = None

    @property
    def quantized(self) -> bool:
        """Whether linear weights are stored in fewer than 16 bits."""
        return self.weight_bits < 16

    def linear_bytes(self, n_in: int, n_out: int, group_size: int, dtype_bytes: int) -> tuple[int, int]:
        """(weight bytes, scale bytes) of one linear layer shard ``n_in x n_out``.

        16-bit: 2 B/param. FP8: 1 B/param + two per-tensor FP32 scales (weight, activation). INT8
        SmoothQuant: 1 B/param + one FP32 scale per output channel + a per-tensor activation scale.
        INT4 AWQ: 0.5 B/param, one FP32 scale per ``group_size`` inputs per output
        (``weights_scaling_factor (out, in/group)``, float32 as ModelOpt 0.47 exports it) and a 16-bit
        ``prequant_scaling_factor (in,)``; W4A8 (FP8 activations) adds two per-tensor FP32 scales. Layouts:
        TensorRT-LLM checkpoint format (tests/builders/test_families.py compares with exported bytes).
        """
        params = n_in * n_out
        if not self.quantized:
            return params * dtype_bytes, 0
        weight = params * self.weight_bits // 8
        if self.block_size:  # NVFP4: FP8 (E4M3) scale per block + per-tensor FP32 weight_scale_2 and input_scale
            return weight, n_out * _ceil_div(n_in, self.block_size) + 2 * 4
        if self.uses_group_size:
            scales = n_out * _ceil_div(n_in, group_size) * 4 + n_in * dtype_bytes
            return weight, scales + (2 * 4 if self.fp8_compute else 0)
        if self.per_channel_scales:
            return weight, n_out * 4 + 4
        return weight, 2 * 4


QUANT_RECIPES: dict[str, QuantRecipe] = {r.name: r for r in (
    QuantRecipe("none", None, None, 16, needs_calibration_data=False, fused_mlp=True,
                aiconfigurator_gemm="bfloat16", aiconfigurator_moe="bfloat16"),
    QuantRecipe("fp8", "FP8_DEFAULT_CFG", "FP8", 8, fp8_compute=True, fused_mlp=True,
                aiconfigurator_gemm="fp8_static", aiconfigurator_moe="fp8"),
    QuantRecipe("int4_awq", "INT4_AWQ_CFG", "W4A16_AWQ", 4, uses_group_size=True, int_weight_gemm=True,
                aiconfigurator_gemm="int4_wo", aiconfigurator_moe="int4_wo"),
    QuantRecipe("int4_rtn", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG", "W4A16_AWQ", 4, uses_group_size=True,
                int_weight_gemm=True, aiconfigurator_gemm="int4_wo", aiconfigurator_moe="int4_wo"),
    # GPTQ: ModelOpt exports it as it exports round-to-nearest INT4 (W4A16_AWQ, no pre-quant scale): only the
    # weights differ (tests/facts/modelopt_0_47/gptq.json)
    QuantRecipe("int4_gptq", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG", "W4A16_AWQ", 4, algorithm="gptq", uses_group_size=True,
                int_weight_gemm=True, aiconfigurator_gemm="int4_wo", aiconfigurator_moe="int4_wo"),
    QuantRecipe("w4a8_awq", "W4A8_AWQ_BETA_CFG", "W4A8_AWQ", 4, uses_group_size=True, fp8_compute=True),
    QuantRecipe("int8_sq", "INT8_SMOOTHQUANT_CFG", "W8A8_SQ_PER_CHANNEL", 8, int_weight_gemm=True,
                per_channel_scales=True, smoothquant=True, aiconfigurator_gemm="sq"),
    QuantRecipe("nvfp4", "NVFP4_DEFAULT_CFG", "NVFP4", 4, fp4_compute=True, block_size=16,
                checkpoint_formats=("hf_unified",), aiconfigurator_gemm="nvfp4", aiconfigurator_moe="nvfp4"),
)}
"""Every recipe by name; ``builders.spec.QuantName`` lists the same names."""

GPTQ_BLOCK_SIZE = 128
"""Columns GPTQ updates per block: ``GPTQCalibConfig.block_size``'s default in ModelOpt 0.47
(``modelopt/torch/quantization/config.py``), raised to a multiple of ``group_size`` (the same field's rule: the block
size "must be a multiple of the group_size used in the quantization"): :func:`algorithm_config`."""


def algorithm_config(name: str, group_size: int) -> dict:
    """The ModelOpt ``algorithm`` entry of calibration algorithm ``name`` for INT4 groups of ``group_size``.

    ``gptq`` (ModelOpt 0.47 ``GPTQCalibConfig``, ``model_calib.gptq``): damping 1% of the mean Hessian diagonal
    (``perc_damp`` default), ``block_size`` :data:`GPTQ_BLOCK_SIZE` rounded up to a multiple of ``group_size``,
    ``fused`` off (its Triton kernel is for NVFP4 weights only and needs a GPU; the column loop runs on torch CPU),
    and ``layerwise`` on: decoder layers are quantized one after the other, each layer's Hessian taken from the
    outputs of the already quantized layers before it (GPTQ's sequential order, as ModelOpt's own GPTQ recipe
    ``modelopt_recipes/general/ptq/nvfp4_default-kv_none-gptq.yaml`` sets it), no per-layer checkpoints.
    """
    if name != "gptq":
        raise KeyError(name)
    return {"method": "gptq", "perc_damp": 0.01, "block_size": _ceil_div(GPTQ_BLOCK_SIZE, group_size) * group_size,
            "fused": False, "layerwise": {"enable": True}}


ALGORITHMS = ("gptq",)
"""Calibration algorithms a recipe may set (:attr:`QuantRecipe.algorithm`, :func:`algorithm_config`)."""

KV_CACHE_RECIPES: dict[str, str] = {"fp8": "FP8_KV_CFG"}
"""KV-cache quantization (spec ``kv_cache_quant_algo``) to its ModelOpt config name."""


def recipe(name: str) -> QuantRecipe:
    """The recipe called ``name`` (a key of :data:`QUANT_RECIPES`; the spec validated it)."""
    return QUANT_RECIPES[name]
