"""AutoGPTQ and AutoAWQ checkpoints on TensorRT-LLM 1.2.1's engine path: converted to a TensorRT-LLM checkpoint.

Upstream reads these HF folders itself: ``<Model>.from_hugging_face(dir, dtype, mapping=Mapping(...),
quant_config=QuantConfig(quant_algo=W4A16_GPTQ, group_size, has_zero_point), use_autoawq=<AutoAWQ>)`` then
``save_checkpoint(out, save_config=(rank == 0))`` per rank, as its ``examples/models/core/llama/convert_checkpoint.py``
does from the folder's ``quantization_config`` (``update_quant_config_from_hf``: AutoAWQ becomes W4A16_GPTQ with
``use_autoawq``; GPTQ with ``desc_act`` true is refused there). Facts: tests/facts/trtllm_1_2_1/prequantized.json
``engine_path.hf_quantization_config_route``.

TensorRT-LLM cannot run here, so the conversion is a small Python program (:data:`CONVERT_PROGRAM`) with a JSON spec
(:func:`convert_spec`): the GPU-host bundle runs it before ``trtllm-build`` (model_repo.bundle), and a build with
TensorRT-LLM installed runs it as its checkpoint stage (:func:`convert`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from plugins.errors import StageError

ENGINE_CLASSES = {"llama": "LLaMAForCausalLM", "qwen": "QWenForCausalLM"}
"""ModelOpt decoder type -> the TensorRT-LLM 1.2.1 model class whose ``from_hugging_face`` reads AutoAWQ/AutoGPTQ
folders (``use_autoawq``; ``tensorrt_llm/models/__init__.py`` MODEL_MAP names the class by architecture)."""

PROGRAM_NAME = "convert_prequantized.py"
SPEC_NAME = "convert_prequantized.json"

CONVERT_PROGRAM = '''#!/usr/bin/env python3
"""Written by trtpipe: convert a pre-quantized HF folder (AutoGPTQ / AutoAWQ) into a TensorRT-LLM checkpoint with
TensorRT-LLM's own from_hugging_face, one rank at a time. Usage: convert_prequantized.py SPEC.json HF_DIR OUT_DIR"""
import json
import sys

import tensorrt_llm.models as models
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.modeling_utils import QuantConfig
from tensorrt_llm.quantization import QuantAlgo

spec = json.load(open(sys.argv[1]))
hf_dir, out_dir = sys.argv[2], sys.argv[3]
cls = getattr(models, spec["model_class"])
qc = spec["quant_config"]
quant_config = QuantConfig(quant_algo=getattr(QuantAlgo, qc["quant_algo"]), group_size=qc["group_size"],
                           has_zero_point=qc["has_zero_point"], pre_quant_scale=qc["pre_quant_scale"])
world = spec["tp_size"] * spec["pp_size"]
for rank in range(world):
    mapping = Mapping(world_size=world, rank=rank, tp_size=spec["tp_size"], pp_size=spec["pp_size"])
    model = cls.from_hugging_face(hf_dir, spec["dtype"], mapping=mapping, quant_config=quant_config,
                                  **spec["kwargs"])
    model.save_checkpoint(out_dir, save_config=(rank == 0))
    print(f"rank {rank} of {world} converted", flush=True)
'''
"""The conversion, against TensorRT-LLM 1.2.1's API (module names and signatures in the facts above)."""


def convert_spec(pq, *, decoder_type: str, dtype: str, tp_size: int, pp_size: int) -> dict:
    """The JSON the conversion program reads.

    Args:
        pq: builders.prequant.Prequantized (``awq`` or ``gptq``).
        decoder_type: ModelOpt's decoder type of the family (:data:`ENGINE_CLASSES` keys).
        dtype: the build dtype (``float16``/``bfloat16``).
        tp_size, pp_size: the checkpoint's mapping.

    Returns:
        ``{"model_class", "dtype", "tp_size", "pp_size", "quant_config": {"quant_algo": "W4A16_GPTQ", "group_size",
        "has_zero_point", "pre_quant_scale": false}, "kwargs": {"use_autoawq": true} (AutoAWQ) or {}}``: what
        upstream's ``update_quant_config_from_hf`` sets for the folder's quantization_config.
    """
    awq = pq.method == "awq"
    return {"model_class": ENGINE_CLASSES[decoder_type], "dtype": dtype, "tp_size": tp_size, "pp_size": pp_size,
            "quant_config": {"quant_algo": "W4A16_GPTQ", "group_size": pq.group_size or 128,
                             "has_zero_point": bool(pq.detail.get("zero_point", True)) if awq else True,
                             "pre_quant_scale": False},
            "kwargs": {"use_autoawq": True} if awq else {}}


def write_program(folder: Path, spec: dict) -> None:
    """Write :data:`PROGRAM_NAME` and :data:`SPEC_NAME` into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROGRAM_NAME).write_text(CONVERT_PROGRAM)
    (folder / PROGRAM_NAME).chmod(0o755)
    (folder / SPEC_NAME).write_text(json.dumps(spec, indent=2) + "\n")


def check_converted(out_dir: Path, world_size: int) -> dict:
    """The converted checkpoint's config.json, after checking it is a W4A16_GPTQ TensorRT-LLM checkpoint with one
    ``rank{r}.safetensors`` per rank.

    Raises:
        StageError: config.json or a rank file missing, or another quant_algo.
    """
    cfg_path = Path(out_dir) / "config.json"
    if not cfg_path.is_file():
        raise StageError(f"the conversion wrote no config.json in {out_dir} (see {Path(out_dir) / 'convert.log'})")
    cfg = json.loads(cfg_path.read_text())
    algo = (cfg.get("quantization") or {}).get("quant_algo")
    missing = [f"rank{r}.safetensors" for r in range(world_size) if not (Path(out_dir) / f"rank{r}.safetensors").is_file()]
    if algo != "W4A16_GPTQ" or missing:
        raise StageError(f"the converted checkpoint {out_dir} is not what was asked: quant_algo {algo} (expected "
                         f"W4A16_GPTQ), missing {missing or 'nothing'}")
    return cfg


def convert(hf_dir: Path, out_dir: Path, spec: dict, *, python: str = sys.executable) -> dict:
    """Run the conversion with ``python`` (an interpreter that imports TensorRT-LLM 1.2.1) into ``out_dir``; its
    output goes to ``out_dir/convert.log``. Returns stage facts.

    Raises:
        StageError: the program failed (the log's last lines), or :func:`check_converted`.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    write_program(out_dir / ".convert", spec)
    argv = [python, str(out_dir / ".convert" / PROGRAM_NAME), str(out_dir / ".convert" / SPEC_NAME), str(hf_dir),
            str(out_dir)]
    with open(out_dir / "convert.log", "w") as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = (out_dir / "convert.log").read_text().strip().splitlines()[-5:]
        raise StageError(f"converting {hf_dir} with TensorRT-LLM's from_hugging_face failed (exit {done.returncode}): "
                         + " | ".join(tail))
    cfg = check_converted(out_dir, spec["tp_size"] * spec["pp_size"])
    return {"converted_with": spec, "quant_algo": cfg["quantization"]["quant_algo"], "argv": argv}
