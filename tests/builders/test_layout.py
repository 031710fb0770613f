"""Where outputs live (one root) and which spec fields decide which stage's cache key."""

from __future__ import annotations

from pathlib import Path

import pytest

from builders.layout import build_dir, build_root, resolve_build
from builders.spec import decides
from tests.conftest import DEFAULT_BUILD


def test_project_root_is_trtpipe_home_or_the_current_directory(tmp_path, monkeypatch):
    build = resolve_build(DEFAULT_BUILD, "cpu", "fp8")
    monkeypatch.setenv("TRTPIPE_HOME", str(tmp_path / "home"))
    assert build_dir(build, variant="fp8") == tmp_path / "home" / "build" / "smollm2-135m" / "cpu-fp8"
    monkeypatch.delenv("TRTPIPE_HOME")
    monkeypatch.chdir(tmp_path)
    assert build_root() == tmp_path / "build"
    assert build.settings.quantization.quant_algo == "fp8"


def test_key_fields_are_the_declared_ones():
    build = resolve_build(DEFAULT_BUILD, "cpu")
    assert set(build.key_fields("checkpoint")) == {"model.decoder_type", "dtype", "quantization",
                                                    "parallelism.tp_size", "parallelism.pp_size",
                                                    "parallelism.moe_tp_size", "parallelism.moe_ep_size"}
    assert set(build.key_fields("verify")) == {"quantization.calibration.dataset", "gates"}
    assert set(build.key_fields("engine")) == {"runtime", "limits"}
    assert set(build.key_fields("model_repo")) == {"serving", "model.trust_remote_code",
                                                    "parallelism.enable_attention_dp"}
    assert build.key_fields("engine")["limits"]["max_batch_size"] == build.settings.limits.max_batch_size


def test_a_changed_field_changes_only_the_keys_it_decides():
    base = resolve_build(DEFAULT_BUILD, "cpu")
    port = base.model_copy(update={"settings": base.settings.model_copy(update={
        "serving": base.settings.serving.model_copy(update={"http_port": 9000})})})
    assert port.key_fields("checkpoint") == base.key_fields("checkpoint")
    assert port.key_fields("engine") == base.key_fields("engine")
    assert port.key_fields("model_repo") != base.key_fields("model_repo")


def test_decides_refuses_an_unknown_stage():
    with pytest.raises(ValueError, match="unknown stage"):
        decides("enigne")


def test_runtime_override_has_its_own_folder():
    from builders.layout import variant

    build = resolve_build(DEFAULT_BUILD, "h100", "fp8", "trtllm-llmapi")
    assert build.settings.runtime == "trtllm-llmapi" and build.settings.quantization.quant_algo == "fp8"
    assert build_dir(build, Path("/r"), variant("fp8", "trtllm-llmapi")) == Path("/r/smollm2-135m/h100-fp8-trtllm-llmapi")
    assert variant(None, None) is None and variant(None, "pytorch") == "pytorch"


def test_an_override_the_build_file_already_says_adds_no_folder():
    """`make build-engine TARGET=h200 RUNTIME=trtllm-llmapi`: h200 is trtllm-llmapi fp8 in the default build file,
    so the plain h200 folder is built; only what really changes gets a suffix."""
    from builders.layout import variant

    assert variant("fp8", "trtllm-llmapi", DEFAULT_BUILD, "h200") is None
    assert variant("int4_awq", "trtllm-llmapi", DEFAULT_BUILD, "h200") == "int4_awq"
    assert variant(None, "pytorch", DEFAULT_BUILD, "h200") == "pytorch"
    assert variant("int4_awq", "pytorch", DEFAULT_BUILD, "cpu") is None
