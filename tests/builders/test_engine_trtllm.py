"""trtllm-build command line, subprocess run and output check, against the 1.2.1 test double."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from model_repo.launch import leader_mode_argv
from builders.spec import LimitsConfig
from builders.engine_trtllm import check_engine_output, run_trtllm_build, trtllm_build_argv
from plugins.errors import StageError
from plugins.recipes import QUANT_RECIPES
from plugins.architectures import ARCHITECTURES
from plugins.resolve import resolve_plugins
from tests.conftest import DOUBLE

LIMITS = LimitsConfig(max_batch_size=8, max_input_len=1024, max_seq_len=2048, max_num_tokens=2048,
                      max_beam_width=1, tokens_per_block=32)


def _plugins(quant="fp8", tp=1):
    return resolve_plugins(quant=QUANT_RECIPES[quant], kv_cache_quant_algo=None, dtype="float16", sm=90, tp_size=tp, world_size=tp,
                           architecture=ARCHITECTURES["LlamaForCausalLM"], tokens_per_block=32, enable_kv_cache_reuse=False,
                           enable_chunked_context=False)


def _ckpt(tmp_path: Path, world: int) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"dtype": "float16", "mapping": {"world_size": world}}))
    return ckpt


def test_argv_shape_and_workers_capped(tmp_path):
    argv = trtllm_build_argv(checkpoint_dir=Path("/c"), output_dir=Path("/o"), limits=LIMITS,
                             plugins=_plugins(tp=3), world_size=3, gpus_available=2, timing_cache=Path("/t.cache"))
    assert argv[:5] == ["trtllm-build", "--checkpoint_dir", "/c", "--output_dir", "/o"]
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert pairs["--workers"] == "2" and pairs["--max_num_tokens"] == "2048" and pairs["--gemm_plugin"] == "disable"
    assert pairs["--input_timing_cache"] == pairs["--output_timing_cache"] == "/t.cache"
    assert "--nccl_plugin" not in argv  # implicit: trtllm-build applies it


@pytest.mark.parametrize("quant", ["none", "fp8", "int4_awq", "w4a8_awq", "int8_sq"])
def test_double_accepts_generated_argv_and_output_check_passes(tmp_path, quant):
    out = tmp_path / "engine"
    out.mkdir()
    argv = trtllm_build_argv(checkpoint_dir=_ckpt(tmp_path, 2), output_dir=out, limits=LIMITS,
                             plugins=_plugins(quant, tp=2), world_size=2, gpus_available=8,
                             timing_cache=tmp_path / "tc", executable=[str(DOUBLE)])
    run_trtllm_build(argv, out / "trtllm-build.log", progress=False)
    cfg = check_engine_output(out, world_size=2, limits=LIMITS)
    assert cfg["version"] == "1.2.1"
    assert "Total time of building all engines" in (out / "trtllm-build.log").read_text()


def test_double_rejects_unknown_flag_and_bad_value(tmp_path):
    for extra in (["--paged_context_fmha", "enable"], ["--gemm_plugin", "int8"], ["--kv_cache_type", "blocks"]):
        res = subprocess.run([str(DOUBLE), "--checkpoint_dir", str(tmp_path), *extra], capture_output=True, text=True)
        assert res.returncode == 2, extra


def test_failed_build_raises_with_log_tail(tmp_path):
    argv = [str(DOUBLE), "--checkpoint_dir", str(tmp_path), "--no_such_flag", "1"]
    with pytest.raises(StageError, match="trtllm-build failed .exit 2"):
        run_trtllm_build(argv, tmp_path / "log", progress=False)
    assert "no_such_flag" in (tmp_path / "log").read_text()


@pytest.mark.parametrize("knob,match", [("TRTPIPE_DOUBLE_MISMATCH", "max_batch_size: engine 9 vs plan 8"),
                                        ("TRTPIPE_DOUBLE_SKIP_RANK", r"missing \['rank1.engine'\]")])
def test_output_check_refuses_bad_engine(tmp_path, monkeypatch, knob, match):
    monkeypatch.setenv(knob, "1")
    out = tmp_path / "engine"
    argv = trtllm_build_argv(checkpoint_dir=_ckpt(tmp_path, 2), output_dir=out, limits=LIMITS,
                             plugins=_plugins(), world_size=2, gpus_available=2, executable=[str(DOUBLE)])
    run_trtllm_build(argv, tmp_path / "log", progress=False, env=dict(os.environ))
    with pytest.raises(StageError, match=match):
        check_engine_output(out, world_size=2, limits=LIMITS)


def test_serve_argv_leader_mode():
    argv = leader_mode_argv(3, "/repo", http_port=8000, grpc_port=8001, metrics_port=8002)
    ranks = " ".join(argv).split(" : ")
    assert len(ranks) == 3 and argv[:2] == ["mpirun", "--allow-run-as-root"]
    for i, cmd in enumerate(ranks):
        assert f"shm-region-prefix-name=prefix{i}_" in cmd
        assert ("--load-model=tensorrt_llm" in cmd) == (i != 0)
        assert ("--model-control-mode=explicit" in cmd) == (i != 0)


def test_double_accepts_what_the_real_one_accepts(tmp_path):
    """Case-insensitive enums (--kv_cache_type goes through KVCacheType.from_string) and the aliases of the
    real parser (trtllm_build.json); the value sets are the facts' own, so the double cannot drift from them."""
    from tests.doubles.trtllm_build import parser

    p = parser()
    for value in ("paged", "PAGED", "Paged", "continuous"):
        assert p.parse_args(["--kv_cache_type", value]).kv_cache_type in ("paged", "continuous")
    assert p.parse_args(["--max_decoder_seq_len", "64"]).max_seq_len == 64
    assert p.parse_args(["--max_multimodal_len", "8"]).max_prompt_embedding_table_size == 8
    for bad in (["--use_fp8_context_fmha", "ENABLE"], ["--log_level", "loud"], ["--workers", "two"]):
        with pytest.raises(SystemExit):
            p.parse_args(bad)
