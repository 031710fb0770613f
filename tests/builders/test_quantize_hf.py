"""The trtllm-llmapi runtime's checkpoint: ModelOpt's unified HF export, run for real on a tiny model."""

from __future__ import annotations

import json

import pytest

from builders.quantize_hf import quantize_to_hf_checkpoint

pytestmark = pytest.mark.slow  # ModelOpt fp8 calibration and unified HF export


def test_unified_hf_export_writes_a_quantized_hf_folder(tiny_llama, tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    info = quantize_to_hf_checkpoint(tiny_llama, out, quant_algo="fp8", group_size=128, kv_cache_quant_algo=None,
                                     dtype="float16", calib_samples=[[1, 2, 3, 4, 5, 6, 7, 8]] * 2)
    assert info["calibration_samples"] == 2
    cfg = json.loads((out / "config.json").read_text())
    qcfg = cfg.get("quantization_config") or json.loads((out / "hf_quant_config.json").read_text())
    assert "fp8" in json.dumps(qcfg).lower(), qcfg
    assert any(out.glob("*.safetensors")) and (out / "tokenizer.json").is_file()
