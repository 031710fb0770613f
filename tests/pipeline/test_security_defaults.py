"""Security defaults: every listener on 127.0.0.1 unless told otherwise; safetensors only (a pickle checkpoint
is refused with the reason); no remote code."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from builders.model_fetch import check_hf_folder
from pipeline import serve
from pipeline.cli import make_parser
from pipeline.openai_frontend import build_parser as frontend_parser
from plugins.errors import SpecError
from plugins.runtimes import leader_mode_argv


def _default(cls, name):
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def test_every_listener_defaults_to_loopback():
    assert _default(serve.ServerConfig, "address") == "127.0.0.1"
    assert _default(serve.FrontendLaunch, "address") == "127.0.0.1"
    assert _default(serve.TrtllmServeConfig, "address") == "127.0.0.1"
    assert inspect.signature(serve.trtllm_serve_config).parameters["address"].default == "127.0.0.1"
    assert inspect.signature(leader_mode_argv).parameters["address"].default == "127.0.0.1"
    assert frontend_parser().parse_args(["--grpc-url", "x:1", "--model", "m", "--tokenizer", "t", "--max-input-len",
                                         "8", "--max-seq-len", "16"]).host == "127.0.0.1"
    assert make_parser().parse_args(["serve"]).address == "127.0.0.1"
    # and tritonserver is told to bind there, each of its three listeners
    argv = serve.command(serve.ServerConfig(model_repository=Path("/nonexistent")))
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"):
        assert flag in argv


def test_a_pickle_checkpoint_is_refused_with_the_reason(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(SpecError) as e:
        check_hf_folder(tmp_path)
    p = e.value.problems[0]
    assert p.code == "model_pickle" and "run code" in p.rule and "safe_serialization" in p.fix
    (tmp_path / "model.safetensors").write_bytes(b"")
    check_hf_folder(tmp_path)  # safetensors beside it: read those
