"""Checkpoint and "engine" for the ``trtllm-llmapi`` runtime.

TensorRT-LLM's LLM API (PyTorch backend) loads ModelOpt's *unified HF* checkpoint directly:
a Hugging Face folder whose ``config.json`` carries a ``quantization_config`` written by
``modelopt.torch.export.export_hf_checkpoint`` (plus ``hf_quant_config.json``). No engine
is built; the engine folder is that checkpoint with the tokenizer and ``engine.json`` (the
limits the Triton model passes to ``tensorrt_llm.LLM``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from builders.spec import LimitsConfig
from plugins.errors import StageError


def quantize_to_hf_checkpoint(hf_dir: Path, out_dir: Path, *, quant_algo: str, group_size: int,
                              kv_cache_quant_algo: str | None, dtype: str, calib_samples: list[list[int]],
                              progress: Callable[[str, int], Any] | None = None,
                              trust_remote_code: bool = False) -> dict:
    """Quantize ``hf_dir`` with ModelOpt and export the unified HF checkpoint into ``out_dir`` (the source loaded
    with ``trust_remote_code``, the spec's ``model.trust_remote_code``: builders.quantize.load_source_model).

    Raises:
        StageError: ModelOpt refused the model or the recipe.
    """
    import modelopt
    import torch
    from modelopt.torch.export import export_hf_checkpoint

    from builders.model_fetch import copy_tokenizer
    from builders.quantize import load_source_model, quantize_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    model = load_source_model(hf_dir, torch.float32 if device == "cpu" else torch_dtype,
                              trust_remote_code=trust_remote_code)
    model.to(device).eval()
    calib = quantize_model(model, quant_algo=quant_algo, group_size=group_size,
                           kv_cache_quant_algo=kv_cache_quant_algo, calib_samples=calib_samples, progress=progress)
    t1 = time.perf_counter()
    try:
        model.to(torch_dtype)
        with torch.inference_mode():
            if calib["quantized"]:
                export_hf_checkpoint(model, export_dir=str(out_dir))
            else:  # nothing quantized: an HF checkpoint (ModelOpt's export refuses unquantized fused MoE experts)
                model.save_pretrained(str(out_dir))
    except Exception as exc:
        raise StageError(f"ModelOpt unified HF export ({quant_algo}) failed: {exc}") from exc
    copy_tokenizer(hf_dir, out_dir)
    return {"format": "modelopt unified HF", **calib, "export_s": round(time.perf_counter() - t1, 3),
            "device": device, "modelopt_version": modelopt.__version__}


def prepare_llmapi_engine(ckpt_dir: Path, hf_dir: Path, out_dir: Path, *, limits: LimitsConfig) -> dict:
    """Hard-link the unified checkpoint into ``out_dir`` and record the limits in ``engine.json`` (the options
    ``tensorrt_llm.LLM`` gets are the repository's llm_api_options.yaml, builders.llmapi_options)."""
    from builders.model_fetch import copy_tokenizer

    if not (ckpt_dir / "config.json").is_file():
        raise StageError(f"{ckpt_dir}: no config.json: the checkpoint stage did not complete; rerun the build")
    for f in sorted(ckpt_dir.iterdir()):
        if f.is_file() and f.name != "stage.json":
            try:
                os.link(f, out_dir / f.name)
            except OSError:
                shutil.copy2(f, out_dir / f.name)
    copy_tokenizer(hf_dir, out_dir)
    from builders.prequant import detect_folder

    pq = detect_folder(ckpt_dir)  # the trtllm-llmapi runtime takes a pre-quantized source as it is
    fmt = "modelopt-unified-hf" if pq is None or pq.method == "modelopt" else f"{pq.method}-hf"
    engine = {"format": fmt, "runtime": "trtllm-llmapi", "build_config": limits.as_dict(),
              "quantization": json.loads((ckpt_dir / "config.json").read_text()).get("quantization_config")}
    (out_dir / "engine.json").write_text(json.dumps(engine, indent=2) + "\n")
    return engine
