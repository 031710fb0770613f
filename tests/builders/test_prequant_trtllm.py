"""AutoAWQ / AutoGPTQ sources on the trtllm runtime: converted by TensorRT-LLM's own from_hugging_face, in the GPU-host
bundle (TensorRT-LLM absent here) or as the checkpoint stage where it is installed (the injected double of
tests/doubles/trtllm_python.py stands in for that interpreter, checked against tests/facts/trtllm_1_2_1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from builders.engine_trtllm import Toolchain
from builders.spec import load_spec
from pipeline.build import run_build
from plugins.errors import SpecError
from tests.conftest import smollm2_tokenizer_dir, tiny_llama_model, write_spec
from tests.prequant_formats import write_awq, write_gptq

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"


def _source(tmp_path, kind: str, **kw) -> Path:
    model = tiny_llama_model(bos_token_id=1, eos_token_id=2, pad_token_id=2)
    write = write_awq if kind == "awq" else write_gptq
    return write(model, tmp_path / kind, group_size=32, tokenizer_src=smollm2_tokenizer_dir(), **kw)


def _build(tmp_path, src: Path, **kw):
    spec = write_spec(tmp_path / "b.yaml", src, runtime="trtllm", quant="int4_awq" if "awq" in src.name else "none")
    text = spec.read_text()
    if "gptq" in src.name:  # let the checkpoint's own recipe stand
        text = text.replace("quant_algo: none, ", "")
    spec.write_text(text)
    return load_spec(spec, "h100")


@pytest.mark.parametrize("kind", ["gptq", "awq"])
def test_the_bundle_converts_the_source_before_trtllm_build(tmp_path, kind):
    src = _source(tmp_path, kind)
    manifest = run_build(_build(tmp_path, src), out_root=tmp_path / "out", progress=False)
    bundle = Path(manifest["handoff"]["bundle"])
    assert (bundle / "source" / "model.safetensors").is_file() and not (bundle / "checkpoint").exists()
    spec = json.loads((bundle / "convert_prequantized.json").read_text())
    assert spec["model_class"] == "LLaMAForCausalLM"
    assert spec["quant_config"] == {"quant_algo": "W4A16_GPTQ", "group_size": 32, "has_zero_point": True,
                                    "pre_quant_scale": False}
    assert spec["kwargs"] == ({"use_autoawq": True} if kind == "awq" else {})
    script = (bundle / "build_and_serve.sh").read_text()
    subprocess.run(["bash", "-n", str(bundle / "build_and_serve.sh")], check=True)
    body = script[script.index("build() {"):]
    assert body.index("  convert\n") < body.index('"$TRTLLM_BUILD"')
    assert manifest["stages"]["checkpoint"]["info"]["skipped"]


def test_the_bundles_convert_step_runs_the_program_and_checks_its_output(tmp_path):
    """The script's convert function, run with the double interpreter as PY: the checkpoint appears; run again, it
    is kept; a double that fails leaves no checkpoint/."""
    src = _source(tmp_path, "gptq")
    manifest = run_build(_build(tmp_path, src), out_root=tmp_path / "out", progress=False)
    bundle = Path(manifest["handoff"]["bundle"])
    script = (bundle / "build_and_serve.sh").read_text()
    start = script.index("convert() {")
    fn = script[start:script.index("\n}\n", start) + 3]
    prelude = script[:script.index("check_versions() {")]
    wrapper = tmp_path / "py"
    wrapper.write_text(f"#!/bin/sh\nif [ \"$1\" = - ]; then exec {sys.executable} \"$@\"; fi\n"
                       f"exec {sys.executable} {DOUBLES / 'trtllm_python.py'} \"$@\"\n")
    wrapper.chmod(0o755)
    run = tmp_path / "run.sh"
    run.write_text(prelude.replace('BUNDLE_DIR="$(cd', f'BUNDLE_DIR="{bundle}" #') + fn + "convert\n")
    done = subprocess.run(["bash", str(run)], env={"PATH": "/usr/bin:/bin", "PYTHON": str(wrapper)},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    cfg = json.loads((bundle / "checkpoint" / "config.json").read_text())
    assert cfg["quantization"]["quant_algo"] == "W4A16_GPTQ" and (bundle / "checkpoint" / "rank0.safetensors").is_file()


def test_with_tensorrt_llm_installed_the_checkpoint_stage_converts(tmp_path, trtllm_double):
    src = _source(tmp_path, "gptq")
    toolchain = Toolchain(trtllm_double.executable, trtllm_double.versions,
                          python=str(DOUBLES / "trtllm_python.py"))
    manifest = run_build(_build(tmp_path, src), out_root=tmp_path / "out", progress=False, toolchain=toolchain)
    ckpt = manifest["stages"]["checkpoint"]
    assert ckpt["info"]["quant_algo"] == "W4A16_GPTQ" and Path(ckpt["path"]).name == "checkpoint"
    engine = json.loads((Path(manifest["stages"]["engine"]["path"]) / "config.json").read_text())
    assert engine["pretrained_config"]["quantization"]["quant_algo"] == "W4A16_GPTQ"
    assert manifest["stages"]["verify"]["info"]["passed"] is not None  # scored from the source's own weights


def test_desc_act_and_v2_and_other_families_are_refused_on_the_engine_path(tmp_path):
    for kw, words in (({"desc_act": True}, "desc_act true"), ({"checkpoint_format": "gptq_v2"}, "v1 gptq format")):
        src = _source(tmp_path / str(len(words)), "gptq", **kw)
        with pytest.raises(SpecError) as err:
            run_build(_build(tmp_path / str(len(words)), src), out_root=tmp_path / "out", progress=False)
        p = next(p for p in err.value.problems if p.code == "prequant_runtime")
        assert words in p.rule and "runtime: pytorch" in p.fix


def test_the_conversion_double_refuses_what_upstream_refuses(tmp_path):
    """The double fails a spec that disagrees with upstream's update_quant_config_from_hf, so the tests above can
    fail when the product's spec drifts."""
    from builders import prequant_trtllm

    src = _source(tmp_path, "awq")
    spec = {"model_class": "LLaMAForCausalLM", "dtype": "float16", "tp_size": 1, "pp_size": 1,
            "quant_config": {"quant_algo": "W4A16_GPTQ", "group_size": 32, "has_zero_point": True,
                             "pre_quant_scale": False}, "kwargs": {}}  # AutoAWQ without use_autoawq
    from plugins.errors import StageError

    with pytest.raises(StageError, match="differ from upstream"):
        prequant_trtllm.convert(src, tmp_path / "ckpt", spec, python=str(DOUBLES / "trtllm_python.py"))
