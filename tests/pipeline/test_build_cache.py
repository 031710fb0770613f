"""Build cache: hit, partial rebuild, interrupted build, bundle hand-off (tiny random Llama, quant none)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builders import model_fetch
from pipeline.build import run_build
from builders.spec import load_spec
from tests.conftest import REPO, write_spec

pytestmark = pytest.mark.slow  # ModelOpt export of a tiny model: a few seconds per build


def _stages(m):
    return {k: v["cached"] for k, v in m["stages"].items() if k != "model"}


def _snapshot(leaf: Path) -> dict:
    """Every file of the stage folders (not the build's own plan.json and manifest.json, written by every run):
    (inode, size, mtime_ns); a rewritten or replaced file differs."""
    return {str(p.relative_to(leaf)): (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
            for d in sorted(leaf.iterdir()) if d.is_dir() for p in sorted(d.rglob("*")) if p.is_file()}


def _no_work(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"cache hit did work: {what}")
    return refuse


def test_cache_hit_and_partial_rebuilds(tmp_path, tiny_llama, trtllm_double, monkeypatch):
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))
    spec = write_spec(tmp_path / "b.yaml", tiny_llama)
    out = tmp_path / "build"
    m1 = run_build(load_spec(spec, "h100"), out_root=out, progress=False, toolchain=trtllm_double)
    assert _stages(m1) == {"checkpoint": False, "verify": False, "engine": False, "model_repo": False,
                           "deploy": False}
    eng = out / "tiny" / "h100" / "engine"
    assert (eng / "rank0.engine").is_file() and (eng / "trtllm-build.log").is_file()
    info = m1["stages"]["engine"]["info"]
    assert info["executable"] == list(trtllm_double.executable) and "--max_seq_len" in info["argv"]
    cfg = (out / "tiny" / "h100" / "model_repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "tensorrtllm"' in cfg and str(eng) in cfg

    # a no-op rebuild: every stage a hit, and no work done (instead of a wall-clock bound): the source is not
    # re-hashed (the digest memo answers), trtllm-build is not run, no stage folder's file is rewritten
    before = _snapshot(out / "tiny" / "h100")
    with monkeypatch.context() as mp:
        mp.setattr(model_fetch, "folder_digest", _no_work("the source checkpoint was re-hashed"))
        mp.setattr(subprocess, "Popen", _no_work("a process was started (trtllm-build)"))
        m2 = run_build(load_spec(spec, "h100"), out_root=out, progress=False, toolchain=trtllm_double)
    assert all(_stages(m2).values())
    after = _snapshot(out / "tiny" / "h100")
    assert after == before, "a cached stage's files were rewritten"

    # a serving field: only the repository reruns (the deployment files do not hold it)
    write_spec(spec, tiny_llama, extra="    serving: {kv_cache_free_gpu_mem_fraction: 0.5}\n")
    m3 = run_build(load_spec(spec, "h100"), out_root=out, progress=False, toolchain=trtllm_double)
    assert _stages(m3) == {"checkpoint": True, "verify": True, "engine": True, "model_repo": False,
                           "deploy": True}
    # a limit: engine and repository rerun, the checkpoint does not
    write_spec(spec, tiny_llama, extra="    serving: {kv_cache_free_gpu_mem_fraction: 0.5}\n"
                                       "    limits: {max_batch_size: 2}\n")
    m4 = run_build(load_spec(spec, "h100"), out_root=out, progress=False, toolchain=trtllm_double)
    assert _stages(m4) == {"checkpoint": True, "verify": True, "engine": False, "model_repo": False,
                           "deploy": True}
    # a port: only the deployment files (and the repository, which records serving) rerun
    write_spec(spec, tiny_llama, extra="    serving: {kv_cache_free_gpu_mem_fraction: 0.5, http_port: 8100}\n"
                                       "    limits: {max_batch_size: 2}\n")
    m4b = run_build(load_spec(spec, "h100"), out_root=out, progress=False, toolchain=trtllm_double)
    assert _stages(m4b) == {"checkpoint": True, "verify": True, "engine": True, "model_repo": False,
                            "deploy": False}
    compose = (out / "tiny" / "h100" / "deploy" / "docker-compose.yaml").read_text()
    assert "127.0.0.1:8100:8100" in compose and str((out / "tiny" / "h100").resolve()) in compose
    # log level / progress / worker count are not inputs
    m5 = run_build(load_spec(spec, "h100"), out_root=out, progress=True, toolchain=trtllm_double)
    assert all(_stages(m5).values())


def test_interrupted_engine_stage_leaves_nothing_readable(tmp_path, tiny_llama, trtllm_double):
    env = dict(os.environ, TRTPIPE_CACHE=str(tmp_path / "cache"), TRTPIPE_DOUBLE_SLEEP="30")
    spec = write_spec(tmp_path / "b.yaml", tiny_llama)
    out = tmp_path / "build"
    cmd = [sys.executable, "-m", "tests.doubles.run_build", str(spec), "h100", str(out)]
    child = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    leaf = out / "tiny" / "h100"
    deadline = time.time() + 300
    while time.time() < deadline and not list(leaf.glob(".engine.tmp-*/rank0.engine")) \
            and not list(leaf.glob(".engine.tmp-*")):
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(child.pid, signal.SIGKILL)  # the build and its trtllm-build child, mid-stage
    child.wait()
    assert list(leaf.glob(".engine.tmp-*")), "the kill should have hit the engine stage"
    assert not (leaf / "engine").exists() and not (leaf / "model_repo").exists()
    assert (leaf / "checkpoint" / "stage.json").is_file()

    env["TRTPIPE_DOUBLE_SLEEP"] = "0"
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "left by an interrupted build" in res.stderr
    assert not list(leaf.glob(".*.tmp-*"))
    m = json.loads((leaf / "manifest.json").read_text())
    assert _stages(m) == {"checkpoint": True, "verify": True, "engine": False, "model_repo": False,
                          "deploy": False}


def test_bundle_when_tensorrt_llm_absent(tmp_path, tiny_llama, monkeypatch, capsys):
    """No toolchain is installed here: the trtllm runtime hands the engine build to the GPU host."""
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))
    spec = write_spec(tmp_path / "b.yaml", tiny_llama)
    out = tmp_path / "build"
    m = run_build(load_spec(spec, "h100"), out_root=out, progress=False)
    assert list(_stages(m)) == ["checkpoint", "verify", "bundle", "deploy"]
    text = capsys.readouterr().out
    assert "TensorRT-LLM 1.2.1 is not importable here" in text and "build_and_serve.sh" in text
    bundle = out / "tiny" / "h100" / "bundle"
    script = bundle / "build_and_serve.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    body = script.read_text()
    assert "EXPECTED_TRTLLM=1.2.1" in body and "--use_paged_context_fmha enable" in body
    assert (bundle / "checkpoint" / "rank0.safetensors").is_file()
    assert 'backend: "tensorrtllm"' in (bundle / "model_repo" / "tensorrt_llm" / "config.pbtxt").read_text()
    compose = (out / "tiny" / "h100" / "deploy" / "docker-compose.yaml").read_text()
    assert f"bash {bundle.resolve()}/build_and_serve.sh" in compose  # the GPU host runs the bundle's script
    plan = json.loads((bundle / "plan.json").read_text())
    assert plan["tensorrt_llm_version"] == "1.2.1" and plan["world_size"] == 1
    # the script refuses another TensorRT-LLM (none is installed here)
    res = subprocess.run(["bash", str(script), "build"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHON=sys.executable))
    assert res.returncode == 2 and "planned for TensorRT-LLM 1.2.1" in res.stderr
    m2 = run_build(load_spec(spec, "h100"), out_root=out, progress=False)
    assert all(_stages(m2).values())
    _check_bundle_moves(bundle, tmp_path)


def _check_bundle_moves(bundle: Path, tmp_path: Path) -> None:
    """`serve` points the repository at where the bundle is now: after one move, and after a copy of that copy
    (the repository names the folder it was last pointed at; the script's planned path is stale by then)."""
    import shutil

    def serve(folder: Path) -> str:
        res = subprocess.run(["bash", str(folder / "build_and_serve.sh"), "serve"], capture_output=True, text=True)
        assert res.returncode == 2 and "no complete engine" in res.stderr, res.stderr  # stops before serving
        return (folder / "model_repo" / "tensorrt_llm" / "config.pbtxt").read_text() + \
            (folder / "model_repo" / "preprocessing" / "config.pbtxt").read_text()

    first, second = tmp_path / "moved" / "one", tmp_path / "moved" / "two"
    shutil.copytree(bundle, first, symlinks=True)
    text = serve(first)
    assert f'"{first}/engine"' in text and f'"{first}/tokenizer"' in text and str(bundle) not in text
    assert serve(first) == text  # a second run changes nothing
    shutil.copytree(first, second, symlinks=True)
    text = serve(second)
    assert f'"{second}/engine"' in text and f'"{second}/tokenizer"' in text and str(first) not in text
