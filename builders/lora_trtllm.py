"""LoRA adapters for the ``trtllm`` runtime (trtllm-build engines, Triton's C++ ``tensorrtllm`` backend).

* :func:`convert_adapter` turns one PEFT adapter (builders.lora.Adapter) into the two arrays the C++ runtime
  reads, in the layout upstream's ``examples/hf_lora_convert.py`` writes; :func:`write_prefetch_dir` writes
  every adapter of a build as ``<dir>/<task_id>/model.lora_weights.npy`` + ``model.lora_config.npy``, the
  folder the backend's ``lora_prefetch_dir`` parameter loads into its host cache at start-up.
* :func:`engine_modules` and :func:`build_flags` give the trtllm-build LoRA flags for a plan.
* :func:`cache_parameters` gives the backend's LoRA cache parameters for a plan.

Every rule below is recorded, with the upstream file and commit, in tests/facts/trtllm_1_2_1/lora.json:

* layout (``examples/hf_lora_convert.py``): one row per (layer, module):
  ``concat(lora_A.flatten(), (lora_B * scaling).flatten())`` with ``lora_A`` [r, in] and ``lora_B`` [out, r]
  row-major, so ``r * (in + out)`` values; rows zero-padded at the end to the longest; a leading batch
  dimension of 1. ``scaling`` (alpha / r, or alpha / sqrt(r) with rsLoRA) is folded into ``lora_B`` before the
  cast. Config rows ``[module_id, layer, r]`` (int32). Upstream orders rows as the safetensors keys sort (as
  strings); here they are ordered by layer, then module id. The order carries no meaning: each config row names
  its module and layer (``cpp/tensorrt_llm/runtime/loraUtils.cpp``).
* the C++ runtime takes full (unsharded) weights and splits them over tensor-parallel ranks itself.
* dtype: the engine's. ``numpyUtils.cpp`` reads float16 (``<f2``) and float32 but no bfloat16, so a bfloat16
  build has no prefetch folder (:class:`LoraConversionError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from builders.lora import HF_TO_TRTLLM, WEIGHTS_FILE, Adapter
from plugins.errors import StageError

LORA_MODULE_IDS = {"attn_qkv": 0, "attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4, "mlp_h_to_4h": 5,
                   "mlp_4h_to_h": 6, "mlp_gate": 7, "cross_attn_qkv": 8, "cross_attn_q": 9, "cross_attn_k": 10,
                   "cross_attn_v": 11, "cross_attn_dense": 12, "moe_h_to_4h": 13, "moe_4h_to_h": 14, "moe_gate": 15,
                   "moe_router": 16, "mlp_router": 17, "mlp_gate_up": 18}
"""TensorRT-LLM's LoRA module ids (``LoraManager.LORA_MODULE_IDS``, tensorrt_llm/lora_manager.py 1.x): the first
column of ``model.lora_config.npy`` and the choices of trtllm-build ``--lora_target_modules``."""

QKV = ("attn_q", "attn_k", "attn_v")
WEIGHTS_NPY = "model.lora_weights.npy"
CONFIG_NPY = "model.lora_config.npy"
NPY_DTYPES = {"float16": np.dtype("<f2"), "float32": np.dtype("<f4")}
"""Build dtype -> the numpy dtype written; the C++ ``loadNpy`` reads ``f2``/``f4`` (numpyUtils.cpp), no bfloat16."""


class LoraConversionError(StageError):
    """An adapter cannot be written in the layout the C++ runtime reads (the message names the value, the rule
    and what to do)."""


@dataclass(frozen=True)
class ConvertedAdapter:
    """One adapter in the C++ runtime's layout.

    Attributes:
        weights: [1, rows, max_row] in the build dtype; row i holds ``r * (in + out)`` values, then zeros.
        config: [1, rows, 3] int32: module id, layer, rank.
        row_sizes: the meaningful length of each row (``r * (in + out)``); the rest of a row is padding.
    """

    weights: np.ndarray
    config: np.ndarray
    row_sizes: tuple[int, ...]


def engine_modules(trtllm_modules: Iterable[str]) -> list[str]:
    """The LoRA modules a trtllm-build engine holds for ``--lora_target_modules trtllm_modules``: upstream adds
    the missing ones of attn_q/attn_k/attn_v when any is asked for (lora_manager.load_hf_lora,
    get_missing_qkv_modules). Ordered by module id."""
    mods = set(trtllm_modules)
    if mods & set(QKV):
        mods |= set(QKV)
    unknown = sorted(mods - set(LORA_MODULE_IDS))
    if unknown:
        raise LoraConversionError(f"LoRA modules {unknown} are not TensorRT-LLM module names (LORA_MODULE_IDS)")
    return sorted(mods, key=LORA_MODULE_IDS.__getitem__)


def build_flags(lora, dtype: str) -> list[str]:
    """trtllm-build's LoRA flags for ``lora`` (builders.plan.LoraPlan; None: none): ``--lora_plugin <dtype>
    --lora_target_modules <engine modules> --max_lora_rank <rank>`` (tensorrt_llm/commands/build.py; the plugin
    sets plugin_config.lora_plugin, the others build_config.lora_config). No ``--lora_dir``: the engine needs only
    the modules and the rank, the adapters travel in the prefetch folder."""
    if lora is None:
        return []
    return ["--lora_plugin", dtype, "--lora_target_modules", *engine_modules(lora.trtllm_modules),
            "--max_lora_rank", str(int(lora.max_lora_rank))]


def _read_tensors(adapter: Adapter) -> dict:
    """The adapter's tensors as float32 numpy arrays (torch reads bfloat16, which numpy cannot)."""
    from safetensors.torch import load_file

    return {k: v.float().numpy() for k, v in load_file(str(adapter.path / WEIGHTS_FILE)).items()}


def convert_adapter(adapter: Adapter, dtype: str) -> ConvertedAdapter:
    """``adapter`` in upstream's layout (module docstring) in ``dtype``.

    Args:
        adapter: read by builders.lora.read_adapter (its shapes already checked).
        dtype: the build dtype: ``float16`` (or ``float32``).

    Raises:
        LoraConversionError: ``dtype`` is bfloat16 (the C++ npy reader has no bfloat16), or a tensor the header
            promised is missing.
    """
    if dtype not in NPY_DTYPES:
        raise LoraConversionError(
            f"dtype {dtype!r}: TensorRT-LLM 1.2.1's lora_prefetch_dir reader (numpyUtils.cpp loadNpy) reads float16 "
            "and float32 .npy files, no bfloat16, and LoRA weights must be in the engine dtype; build with dtype: "
            "float16 to serve lora.adapters on the trtllm runtime")
    tensors = _read_tensors(adapter)
    prefix = "base_model.model.model.layers" if any(k.startswith("base_model.model.model.") for k in tensors) \
        else "base_model.model.layers"
    from builders.lora import PARENT

    rows, configs, sizes = [], [], []
    order = sorted(adapter.shapes, key=lambda lm: (lm[0], LORA_MODULE_IDS[HF_TO_TRTLLM[lm[1]]]))
    for layer, module in order:
        base = f"{prefix}.{layer}.{PARENT[module]}.{module}"
        try:
            a, b = tensors[f"{base}.lora_A.weight"], tensors[f"{base}.lora_B.weight"]
        except KeyError as exc:
            raise LoraConversionError(f"adapter {adapter.name!r}: {exc.args[0]} missing from {WEIGHTS_FILE}") from None
        row = np.concatenate([a.reshape(-1), (b * np.float32(adapter.scaling)).reshape(-1)]).astype(NPY_DTYPES[dtype])
        rows.append(row)
        sizes.append(row.size)
        configs.append((LORA_MODULE_IDS[HF_TO_TRTLLM[module]], layer, adapter.rank))
    width = max(sizes)
    weights = np.zeros((1, len(rows), width), dtype=NPY_DTYPES[dtype])
    for i, row in enumerate(rows):
        weights[0, i, :row.size] = row
    config = np.asarray(configs, dtype=np.int32).reshape(1, len(rows), 3)
    return ConvertedAdapter(weights=weights, config=config, row_sizes=tuple(sizes))


def write_prefetch_dir(adapters: list[Adapter], out_dir: Path, dtype: str) -> dict:
    """Write every adapter as ``out_dir/<task_id>/model.lora_weights.npy`` and ``model.lora_config.npy`` (the
    backend's ``lora_prefetch_dir`` layout: all-digit folder names are task ids, peftCacheManager.cpp
    prefetchLoraWeights). Returns ``{task_id: {name, rows, weights_bytes}}`` for the stage record.

    Raises:
        LoraConversionError: as :func:`convert_adapter`.
    """
    out = {}
    for adapter in adapters:
        conv = convert_adapter(adapter, dtype)
        folder = out_dir / str(adapter.task_id)
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / WEIGHTS_NPY, conv.weights)
        np.save(folder / CONFIG_NPY, conv.config)
        out[str(adapter.task_id)] = {"name": adapter.name, "rows": int(conv.config.shape[1]),
                                     "weights_bytes": int(conv.weights.nbytes)}
    return out


def cache_parameters(lora, memory) -> dict[str, tuple[str, str]]:
    """The C++ backend's LoRA cache parameters for ``lora`` (builders.plan.LoraPlan) and ``memory``
    (builders.plan.MemoryPlan): ``{key: (value, source)}``.

    * ``lora_cache_max_adapter_size`` = ``optimal`` = max_lora_rank (the backend clamps both to the engine's
      max_lora_rank; a page then holds one max-rank adapter, peftCacheManager.cpp getPageManagerConfig);
    * ``lora_cache_gpu_memory_fraction``: the fraction of the memory left after the engine and the KV pool
      (docs/lora.md; the cache takes fraction x free memory when it is created) that holds
      ``lora.gpu_cache_bytes``: ``gpu_cache_bytes / (device - total + gpu_cache_bytes)``, rounded up to 1e-4;
    * ``lora_cache_host_memory_bytes`` = ``lora.host_cache_bytes`` (bytes).
    """
    left = memory.device_bytes - memory.total_bytes + lora.gpu_cache_bytes
    frac = 1.0 if left <= 0 else min(1.0, math.ceil(lora.gpu_cache_bytes / left * 1e4) / 1e4)
    rank_src = f"plan: lora.max_lora_rank = {lora.max_lora_rank} (one cache page holds one max-rank adapter)"
    return {
        "lora_cache_max_adapter_size": (str(lora.max_lora_rank), rank_src),
        "lora_cache_optimal_adapter_size": (str(lora.max_lora_rank), rank_src),
        "lora_cache_gpu_memory_fraction": (
            f"{frac:.4f}", f"plan: lora.gpu_cache_bytes {lora.gpu_cache_bytes} (max_loras {lora.max_loras} slots) over "
            f"the {max(left, 0)} B left after weights, activations and the KV pool"),
        "lora_cache_host_memory_bytes": (str(lora.host_cache_bytes),
                                         f"plan: lora.host_cache_bytes (max_cpu_loras {lora.max_cpu_loras} slots)"),
    }


def prefetch_dir_of(engine_dir: Path) -> Path:
    """Where the prefetch folder of the engine in ``engine_dir`` lives: ``<engine_dir>/lora``."""
    return Path(engine_dir) / "lora"

