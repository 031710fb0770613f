"""Quantize a Hugging Face model with ModelOpt and export a TensorRT-LLM checkpoint.

The output folder is the TensorRT-LLM checkpoint format (``config.json`` + one
``rank{r}.safetensors`` per rank, rank r = pp_rank * tp_size + tp_rank) written by
``modelopt.torch.export.export_tensorrt_llm_checkpoint``. Quantization recipes are data:
:data:`plugins.recipes.QUANT_RECIPES` maps our names to ModelOpt configs and TensorRT-LLM ``quant_algo``.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from plugins.errors import StageError
from plugins.recipes import KV_CACHE_RECIPES, QUANT_RECIPES, algorithm_config

log = logging.getLogger(__name__)




def modelopt_config(quant_algo: str, group_size: int, kv_cache_quant_algo: str | None = None) -> dict | None:
    """Build the ModelOpt quantization config dict for a recipe (a deep copy; ModelOpt's are shared).

    Sets the block size of INT4 weight quantizers to ``group_size``, replaces the config's calibration algorithm
    with the recipe's own (:attr:`plugins.recipes.QuantRecipe.algorithm`: GPTQ for int4_gptq) and merges the
    KV-cache config entries when ``kv_cache_quant_algo`` is set.
    """
    import modelopt.torch.quantization as mtq

    recipe = QUANT_RECIPES[quant_algo]
    if recipe.modelopt_cfg is None:
        if not kv_cache_quant_algo:
            return None
        # Unquantized weights with a quantized KV cache: disable every quantizer, then enable the KV ones.
        cfg = {"quant_cfg": [{"quantizer_name": "*", "enable": False}], "algorithm": "max"}
    else:
        cfg = copy.deepcopy(getattr(mtq, recipe.modelopt_cfg))
    if recipe.uses_group_size:
        for entry in _quant_entries(cfg):
            name, qcfg = entry
            if "weight_quantizer" in name:
                for sub in qcfg if isinstance(qcfg, list) else [qcfg]:
                    if isinstance(sub, dict) and sub.get("num_bits") == 4 and "block_sizes" in sub:
                        sub["block_sizes"][-1] = group_size
    if recipe.algorithm:
        cfg["algorithm"] = algorithm_config(recipe.algorithm, group_size)
    if kv_cache_quant_algo:
        kv = copy.deepcopy(getattr(mtq, KV_CACHE_RECIPES[kv_cache_quant_algo]))
        cfg["quant_cfg"] = _as_list(cfg["quant_cfg"]) + _as_list(kv["quant_cfg"])
    return cfg


def _as_list(quant_cfg: Any) -> list:
    if isinstance(quant_cfg, list):
        return list(quant_cfg)
    return [{"quantizer_name": k, **({"cfg": v} if not (isinstance(v, dict) and set(v) <= {"enable"}) else v)}
            for k, v in quant_cfg.items()]


def _quant_entries(cfg: dict):
    """Yield (quantizer pattern, quantizer cfg) pairs for both ModelOpt config layouts (list or dict)."""
    qc = cfg["quant_cfg"]
    if isinstance(qc, dict):
        for k, v in qc.items():
            yield k, v
    else:
        for entry in qc:
            if "cfg" in entry:
                yield entry.get("quantizer_name", ""), entry["cfg"]


def rope_fields(hf_config) -> dict:
    """TensorRT-LLM ``rotary_base``/``rotary_scaling`` from an HF config (transformers 4.x or 5.x layout)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    out: dict[str, Any] = {}
    if theta is not None:
        out["rotary_base"] = float(theta)
    scaling = getattr(hf_config, "rope_scaling", None) or params
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        out["rotary_scaling"] = {k: v for k, v in scaling.items() if k != "rope_theta"}
    return out


def needs_calibration(quant_algo: str, kv_cache_quant_algo: str | None) -> bool:
    """Whether ModelOpt runs a calibration forward loop (a quantized KV cache needs one too)."""
    return QUANT_RECIPES[quant_algo].needs_calibration_data or bool(kv_cache_quant_algo)


CALIBRATION_BATCH_TOKENS = 2048
"""Most tokens in one calibration forward pass (8 windows of 256: the default's whole set in one pass)."""


def calibration_batches(samples: list[list[int]], max_tokens: int | None = None) -> list[list[list[int]]]:
    """``samples`` (token-id windows) in order, grouped into batches of equal-length windows of at most
    ``max_tokens`` (default :data:`CALIBRATION_BATCH_TOKENS`) tokens together (at least one window each), so a
    forward pass needs no padding.

    ModelOpt's calibrators average their statistics over every token seen (max, AWQ's activation means and
    per-alpha losses, GPTQ's Hessian), so one pass over 8 windows gives the scales 8 passes of one give
    (SmolLM2-135M int4_awq: bit for bit; tests/builders/test_quantize_batches.py) in about half the time on 2 cores.
    """
    max_tokens = CALIBRATION_BATCH_TOKENS if max_tokens is None else max_tokens
    batches: list[list[list[int]]] = []
    for ids in samples:
        last = batches[-1] if batches else None
        if last and len(last[0]) == len(ids) and (len(last) + 1) * len(ids) <= max_tokens:
            last.append(ids)
        else:
            batches.append([ids])
    return batches


def quantize_model(model, *, quant_algo: str, group_size: int, kv_cache_quant_algo: str | None,
                   calib_samples: list[list[int]], progress: Callable[[str, int], Any] | None = None) -> dict:
    """Quantize ``model`` in place with ModelOpt (fake-quant modules with calibrated scales).

    Returns:
        dict with ``calibration_s``, ``calibration_peak_rss_mib``, ``calibration_samples`` and ``quantized``
        (False: the recipe quantizes nothing, the model is unchanged).

    Raises:
        StageError: ModelOpt refused the model/recipe (message names the cause).
    """
    import modelopt.torch.quantization as mtq
    import torch

    from plugins.fsutil import measure

    cfg = modelopt_config(quant_algo, group_size, kv_cache_quant_algo)
    device = next(model.parameters()).device
    # Layer-by-layer calibration (GPTQ) replays each decoder layer's captured inputs, KV cache included (ModelOpt
    # 0.47 model_calib.py layerwise_calibrate, utils/layerwise_calib.py). With a cache, Gemma 2/3 fail (a replay
    # attends over twice the tokens) and Llama's layers after the first get other GPTQ weights, measurably worse
    # (SmolLM2-135M: perplexity +26.5% instead of +22.5%, docs/benchmarks/quantization.md). Calibration needs none.
    no_cache = {"use_cache": False} if QUANT_RECIPES[quant_algo].algorithm else {}
    with measure("calibration") as timing:
        if cfg is not None:
            passes = {"n": 0}

            batches = calibration_batches(calib_samples)

            def forward_loop(m):
                passes["n"] += 1
                bar = progress(f"calibration pass {passes['n']}", len(calib_samples)) if progress else None
                with torch.no_grad():
                    for batch in batches:
                        m(torch.tensor(batch, device=device), **no_cache)
                        if bar is not None:
                            bar.update(len(batch))
                if bar is not None:
                    bar.close()

            try:
                mtq.quantize(model, cfg, forward_loop)
            except Exception as exc:
                raise StageError(f"ModelOpt quantization ({quant_algo}) failed: {exc}") from exc
    return {"calibration_s": round(timing.wall_s, 3),
            "calibration_peak_rss_mib": round(timing.peak_rss_bytes / 2**20, 1),
            "calibration_samples": len(calib_samples) if cfg is not None else 0, "quantized": cfg is not None}


def export_checkpoint(model, out_dir: Path, *, quant_algo: str, group_size: int, dtype: str, tp_size: int,
                      pp_size: int, decoder_type: str) -> dict:
    """Export a (quantized) model as a TensorRT-LLM checkpoint for ``tp_size`` x ``pp_size`` ranks.

    Returns:
        dict with ``export_s`` and ``patched`` (config.json keys the pipeline had to fill in).

    Raises:
        StageError: ModelOpt's exporter refused the model (message names the cause).
    """
    import torch
    from modelopt.torch.export import export_tensorrt_llm_checkpoint

    t1 = time.perf_counter()
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    try:
        with torch.inference_mode():
            export_tensorrt_llm_checkpoint(model, decoder_type, torch_dtype, str(out_dir),
                                           inference_tensor_parallel=tp_size,
                                           inference_pipeline_parallel=pp_size)
    except Exception as exc:
        raise StageError(f"ModelOpt export to a TensorRT-LLM checkpoint (tp={tp_size}, pp={pp_size}, "
                         f"{quant_algo}, group_size={group_size}) failed: {exc}") from exc
    export_s = time.perf_counter() - t1
    patched = patch_checkpoint_config(Path(out_dir) / "config.json", model.config)
    return {"export_s": round(export_s, 3), "patched": patched}


def load_source_model(hf_dir: Path, dtype, *, trust_remote_code: bool):
    """The source checkpoint as transformers loads it for calibration, on the CPU in ``dtype`` (a torch dtype).

    ``trust_remote_code`` is the spec's ``model.trust_remote_code``: true lets the modules the checkpoint's
    ``auto_map`` names run (its own model class); false loads the library's class for the config's model_type
    (a checkpoint whose code the library cannot stand in for is refused by transformers).

    Raises:
        StageError: a tensor of the model is missing from the files (builders.source_tensors.refuse_missing).
    """
    from builders.source_tensors import load_source_model as load_whole

    return load_whole(hf_dir, dtype, trust_remote_code=trust_remote_code, stage="checkpoint")


def quantize_to_checkpoint(hf_dir: Path, out_dir: Path, *, quant_algo: str, group_size: int,
                           kv_cache_quant_algo: str | None, dtype: str, tp_size: int, pp_size: int,
                           decoder_type: str, calib_samples: list[list[int]],
                           progress: Callable[[str, int], Any] | None = None,
                           trust_remote_code: bool = False) -> dict:
    """Quantize ``hf_dir`` with ModelOpt and export a TensorRT-LLM checkpoint into ``out_dir``.

    Args:
        hf_dir: Hugging Face checkpoint folder.
        out_dir: empty folder that receives ``config.json`` + ``rank{r}.safetensors``.
        quant_algo: key of :data:`QUANT_RECIPES`.
        group_size: INT4 block size along the input dimension.
        kv_cache_quant_algo: ``"fp8"`` or None.
        dtype: ``float16``/``bfloat16``: dtype of unquantized tensors in the checkpoint.
        tp_size, pp_size: inference parallelism the shards are written for.
        decoder_type: ModelOpt decoder family (``llama``).
        calib_samples: token-id sequences for the calibration forward loop.
        progress: optional factory ``progress(description, total)`` returning a tqdm-like bar.
        trust_remote_code: ``model.trust_remote_code`` (:func:`load_source_model`).

    Returns:
        dict with ``calibration_s``, ``calibration_peak_rss_mib``, ``export_s``, ``device``,
        ``modelopt_version``, ``patched`` (config.json keys the pipeline had to fill in after export).

    Raises:
        StageError: ModelOpt refused the model/recipe (message names the cause).
    """
    import modelopt
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_source_model(hf_dir, torch.float32 if device == "cpu" else torch.float16,
                              trust_remote_code=trust_remote_code)
    model.to(device).eval()
    calib = quantize_model(model, quant_algo=quant_algo, group_size=group_size,
                           kv_cache_quant_algo=kv_cache_quant_algo, calib_samples=calib_samples, progress=progress)
    exported = export_checkpoint(model, out_dir, quant_algo=quant_algo, group_size=group_size, dtype=dtype,
                                 tp_size=tp_size, pp_size=pp_size, decoder_type=decoder_type)
    return {**calib, **exported, "device": device, "modelopt_version": modelopt.__version__}


def patch_checkpoint_config(config_path: Path, hf_config) -> dict:
    """Fill in keys ModelOpt 0.47's legacy exporter leaves out (for transformers 5 configs, and the family's
    ``trtllm_keys``: plugins.architectures).

    transformers 5 keeps ``rope_theta`` inside ``rope_parameters``; the exporter looks for a
    ``rotary_base`` attribute, finds none and writes nothing, so TensorRT-LLM would fall back
    to 10000 (SmolLM2 uses 100000): wrong positions, garbage text. A W4A16_AWQ export without
    any ``prequant_scaling_factor`` (round-to-nearest int4_rtn, GPTQ int4_gptq) gets ``pre_quant_scale: false``.
    Returns the keys set.
    """
    from plugins.architectures import architecture

    cfg = json.loads(config_path.read_text())
    patched = {}
    arch = architecture((getattr(hf_config, "architectures", None) or [None])[0])
    family = {"qwen_type": getattr(hf_config, "model_type", None), "attn_bias": arch.qkv_bias if arch else None}
    wanted = {**rope_fields(hf_config), **{k: family[k] for k in (arch.trtllm_keys if arch else ())}}
    for key, value in wanted.items():
        if cfg.get(key) != value:
            patched[key] = {"exported": cfg.get(key), "written": value}
            cfg[key] = value
    quant = cfg.get("quantization") or {}
    if quant.get("pre_quant_scale") and not _has_prequant_scales(config_path.parent):
        # Round-to-nearest INT4 (int4_rtn) and GPTQ (int4_gptq) export as W4A16_AWQ without any prequant_scaling_factor;
        # TensorRT-LLM would expect one per layer when pre_quant_scale is true.
        patched["quantization.pre_quant_scale"] = {"exported": True, "written": False}
        quant["pre_quant_scale"] = False
    if patched:
        config_path.write_text(json.dumps(cfg, indent=4) + "\n")
        log.info("checkpoint config.json: filled in %s from the HF config", sorted(patched))
    return patched


def _has_prequant_scales(ckpt_dir: Path) -> bool:
    from safetensors import safe_open

    with safe_open(str(ckpt_dir / "rank0.safetensors"), framework="pt") as f:
        return any(k.endswith(".prequant_scaling_factor") for k in f.keys())
