"""The installed ModelOpt still is the one tests/facts/modelopt_0_47/gptq.json was read from.

The facts: ModelOpt 0.47's GPTQ calibration (``GPTQCalibConfig`` and its defaults, the ``gptq_calibrate`` mode, the
function that runs it), that no INT4 preset of its own sets GPTQ (int4_gptq is INT4_BLOCKWISE_WEIGHT_ONLY_CFG with
a ``gptq`` algorithm: plugins.recipes.algorithm_config), and how its exports label a GPTQ INT4 checkpoint: as AWQ
(``W4A16_AWQ``), in the TensorRT-LLM checkpoint's config.json and in the unified HF checkpoint's
hf_quant_config.json / config.json ``quantization_config`` alike. A ModelOpt upgrade that changes any of it fails
here, naming the fact, before a build writes a checkpoint the readers (builders/checkpoint.py) label wrongly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from plugins.recipes import QUANT_RECIPES, algorithm_config
from tests.conftest import tiny_llama_model

FACTS = json.loads((Path(__file__).resolve().parents[1] / "facts" / "modelopt_0_47" / "gptq.json").read_text())


def test_installed_modelopt_is_the_recorded_version():
    import modelopt

    assert modelopt.__version__ == FACTS["modelopt"]


def test_gptq_calibration_config_and_mode():
    from modelopt.torch.quantization import model_calib
    from modelopt.torch.quantization.config import GPTQCalibConfig
    from modelopt.torch.quantization.mode import CalibrateModeRegistry

    cal = FACTS["calibration"]
    assert f"{GPTQCalibConfig.__module__}.{GPTQCalibConfig.__name__}" == cal["config_class"]
    dumped = GPTQCalibConfig().model_dump()
    defaults = cal["defaults"]
    assert {k: dumped[k] for k in ("method", "perc_damp", "block_size", "fused")} == \
           {k: defaults[k] for k in ("method", "perc_damp", "block_size", "fused")}
    assert {k: dumped["layerwise"][k] for k in defaults["layerwise"]} == defaults["layerwise"]
    mode = CalibrateModeRegistry.get(cal["mode"])
    assert mode.config_class is GPTQCalibConfig
    assert mode._calib_func.__func__ is getattr(model_calib, cal["function"].rsplit(".", 1)[1])


def test_our_gptq_algorithm_is_a_valid_modelopt_config():
    """What builders.quantize.modelopt_config sets for int4_gptq validates as ModelOpt's GPTQ config, keeps the block
    size a multiple of the group size (GPTQCalibConfig.block_size's rule) and the fused (GPU) kernel off."""
    from modelopt.torch.quantization.config import GPTQCalibConfig

    assert QUANT_RECIPES["int4_gptq"].algorithm == "gptq"
    for group in (16, 64, 128, 256, 1024):
        cfg = GPTQCalibConfig(**algorithm_config("gptq", group))
        assert cfg.block_size % group == 0 and cfg.block_size >= FACTS["calibration"]["defaults"]["block_size"]
        assert cfg.fused is False and cfg.layerwise.enable is True
        assert cfg.layerwise.get_qdq_activations_from_prev_layer is True and cfg.layerwise.checkpoint_dir is None


def test_no_int4_preset_sets_gptq_and_the_base_config_is_round_to_nearest():
    import modelopt.torch.quantization as mtq
    from modelopt.torch.opt.config_loader import BUILTIN_CONFIG_ROOT

    presets = BUILTIN_CONFIG_ROOT.joinpath("configs/ptq/presets/model")
    assert FACTS["calibration"]["int4_preset"] is None
    assert not [p.name for p in presets.iterdir() if "gptq" in p.read_text().lower()]
    for rel, algo in FACTS["calibration"]["gptq_recipes"].items():
        assert "method: gptq" in BUILTIN_CONFIG_ROOT.joinpath(rel).read_text(), rel
    base = FACTS["int4_blockwise_weight_only_cfg"]
    cfg = getattr(mtq, base["name"])
    assert QUANT_RECIPES["int4_gptq"].modelopt_cfg == QUANT_RECIPES["int4_rtn"].modelopt_cfg == base["name"]
    assert cfg["algorithm"] == base["algorithm"]
    weight = [e["cfg"] for e in cfg["quant_cfg"] if e.get("quantizer_name") == "*weight_quantizer" and "cfg" in e]
    assert weight == [{"num_bits": base["weight_quantizer"]["num_bits"],
                       "block_sizes": {int(k) if k.lstrip("-").isdigit() else k: v
                                       for k, v in base["weight_quantizer"]["block_sizes"].items()}}]


def test_export_code_has_no_gptq_label():
    import modelopt.torch.export as export
    from modelopt.torch.export.model_config import QUANTIZATION_INT4_AWQ

    assert QUANTIZATION_INT4_AWQ == FACTS["export"]["quantization_format"]
    sources = [p for p in Path(export.__file__).parent.rglob("*.py")]
    assert sources and not [p.name for p in sources if "gptq" in p.read_text().lower()]


@pytest.mark.slow  # ModelOpt GPTQ calibration and both exports of a tiny model (~10 s)
def test_gptq_exports_are_labelled_as_recorded(tmp_path):
    """Both exports of a GPTQ-calibrated model carry the recorded labels; ours records the same quant_algo."""
    from modelopt.torch.export import export_hf_checkpoint, export_tensorrt_llm_checkpoint

    from builders.quantize import quantize_model

    model = tiny_llama_model(vocab=256, hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2,
                             max_positions=64, tie=False)
    model.config.architectures = ["LlamaForCausalLM"]
    g = torch.Generator().manual_seed(0)
    quantize_model(model, quant_algo="int4_gptq", group_size=64, kv_cache_quant_algo=None,
                   calib_samples=torch.randint(0, 256, (2, 16), generator=g).tolist())
    with torch.inference_mode():
        export_tensorrt_llm_checkpoint(model, "llama", torch.float16, str(tmp_path / "trt"),
                                       inference_tensor_parallel=1, inference_pipeline_parallel=1)
    trt = FACTS["export"]["tensorrt_llm"]
    q = json.loads((tmp_path / "trt" / trt["file"]).read_text())["quantization"]
    assert {k: q.get(k) for k in trt["quantization"]} == trt["quantization"] and q["group_size"] == 64
    assert q["quant_algo"] == QUANT_RECIPES["int4_gptq"].quant_algo

    model.to(torch.float16)
    with torch.inference_mode():
        export_hf_checkpoint(model, export_dir=str(tmp_path / "hf"))
    hf = FACTS["export"]["hf_unified"]
    assert json.loads((tmp_path / "hf" / "hf_quant_config.json").read_text()) == \
           {**hf["hf_quant_config"], "quantization": {**hf["hf_quant_config"]["quantization"], "group_size": 64}}
    qc = json.loads((tmp_path / "hf" / "config.json").read_text())["quantization_config"]
    assert {k: qc.get(k) for k in hf["config_quantization_config"]} == hf["config_quantization_config"]
