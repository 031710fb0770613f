"""The launcher: refuses busy ports before starting, and reports a model that fails to load
with its log lines and a suggested fix (real tritonserver, a repository broken on purpose)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from model_repo.generate import default_sys_path
from pipeline.serve import ServerConfig, ServerError, TritonServer, diagnose, free_ports


def test_busy_port_is_reported_before_starting(tmp_path):
    repo = tmp_path / "repo"
    (repo / "ensemble").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text('name: "ensemble"')
    http, grpc, metrics = free_ports(3)
    with socket.socket() as s:
        s.bind(("127.0.0.1", grpc))
        s.listen()
        with pytest.raises(ServerError, match=rf"port\(s\) \[{grpc}\].*already in use"):
            TritonServer(ServerConfig(repo, http, grpc, metrics)).start()


def test_missing_repository_says_what_to_run(tmp_path):
    with pytest.raises(ServerError, match="trtpipe build"):
        TritonServer(ServerConfig(tmp_path / "nothing")).start()


def test_known_failures_map_to_fixes():
    hints = diagnose("E1130 ... ModuleNotFoundError: No module named 'transformers'")
    assert len(hints) == 1 and "TRTPIPE_PYTHONPATH" in hints[0]
    assert diagnose("all good") == []
    # what every start on a host without a GPU logs is a hint for a GPU repository only
    noise = 'E1130 ensemble_scheduler.cc] "unable to create stream for ensemble: CUDA driver version is insufficient"'
    assert diagnose(noise, gpu=True) and diagnose(noise) and diagnose(noise, gpu=False) == []
    bad = "ValueError: sdpa_backends = 'cudnnx': unknown ['cudnnx']; use 'auto' or a comma list of flash, ..."
    assert any("tensorrt_llm/config.pbtxt's sdpa_backends" in h for h in diagnose(bad))


def test_virtualenv_folders_are_taken_off_the_servers_path(tmp_path):
    from pipeline.serve import server_environment

    venv, plain = tmp_path / "venv", tmp_path / "tools"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /somewhere/else/bin\n")
    (plain / "bin").mkdir(parents=True)
    env = server_environment({"PATH": f"{venv / 'bin'}:{plain / 'bin'}:/usr/bin", "HOME": "/root"})
    assert env["PATH"] == f"{plain / 'bin'}:/usr/bin" and env["HOME"] == "/root"
    log = ('E1130 pb_stub.cc] "Failed to initialize Python stub: ImportError: /opt/py/lib/python3.11/lib-dynload/'
           '_ssl.cpython-311-x86_64-linux-gnu.so: undefined symbol: _PyModule_Add"')
    assert any("first python3 on PATH" in h for h in diagnose(log))


@pytest.mark.e2e
def test_a_second_server_with_the_venv_activated_serves_and_stops_without_touching_the_first(
        default_server, built_default, tmp_path, monkeypatch):
    """Two things of one server start. `source .venv/bin/activate` then serving: the stub must not take the
    venv's python3 as its own (with a venv of another CPython build it loaded that build's lib-dynload and every
    model failed). And stopping that server reaps only orphans: the processes of the default server on the same
    repository stay (before, they were killed by every other server's stop, and the default server answered
    "Stub process ... is not healthy")."""
    import psutil

    from pipeline.client import stream_generate

    if sys.prefix != sys.base_prefix:  # the tests run in a virtualenv: serve as if it were activated
        monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    before = {p.pid for p in psutil.Process(default_server.proc.pid).children(recursive=True)}
    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(built_default / "model_repo", http, grpc, metrics, log_file=tmp_path / "server.log",
                       ready_timeout_s=180, python_path=default_sys_path())
    with TritonServer(cfg):
        pass  # READY: every model loaded
    after = {p.pid for p in psutil.Process(default_server.proc.pid).children(recursive=True)}
    assert before and after == before
    chunks = list(stream_generate(default_server.cfg.grpc_url, "Hello", 2, timeout_s=60))
    assert sum(c.num_tokens for c in chunks) >= 1


def test_repository_device_from_the_tensorrt_llm_config(tmp_path):
    from pipeline.serve import repository_device

    assert repository_device(tmp_path) is None  # no repository
    (tmp_path / "tensorrt_llm").mkdir()
    cfg = tmp_path / "tensorrt_llm" / "config.pbtxt"
    cfg.write_text('name: "tensorrt_llm"\nbackend: "tensorrtllm"\n')
    assert repository_device(tmp_path) == "cuda"
    cfg.write_text('name: "tensorrt_llm"\nbackend: "python"\n'
                   'parameters { key: "device" value: { string_value: "cpu" } }\n')
    assert repository_device(tmp_path) == "cpu"
    cfg.write_text("not a config {")
    assert repository_device(tmp_path) is None


@pytest.mark.e2e
def test_model_that_fails_to_load_is_named_with_its_log(built_default, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(built_default / "model_repo", repo)
    cfg_path = repo / "tensorrt_llm" / "config.pbtxt"
    text = cfg_path.read_text()
    engine = str((built_default / "engine").resolve())
    cfg_path.write_text(text.replace(engine, str(tmp_path / "no-engine")))
    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(repo, http, grpc, metrics, log_file=tmp_path / "server.log", ready_timeout_s=120,
                       python_path=default_sys_path())
    with pytest.raises(ServerError) as err:
        TritonServer(cfg).start()
    msg = str(err.value)
    assert "gpt_model_path" in msg and "tensorrt_llm" in msg
    assert "suggested fixes" in msg
    # a CPU repository: no GPU-absence noise among the lines or the fixes, and each line once
    relevant = msg.split("relevant log lines:\n")[1].split("\nsuggested fixes:")[0].splitlines()
    assert len(relevant) == len(set(relevant)) and relevant
    assert "CUDA driver version" not in msg and "NVML" not in msg


def test_stop_leaves_alone_a_process_that_is_not_the_recorded_server(tmp_path):
    """A stale or copied server.json must not make `trtpipe stop` end an unrelated process (a reused pid)."""
    import json
    import subprocess
    import sys

    import psutil

    from pipeline.server_state import running_from_state, stop_from_state

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = tmp_path / "server.json"
        # the pid of another process, recorded with another start time (what a reused pid looks like)
        state.write_text(json.dumps({"server": "tritonserver", "pid": other.pid,
                                     "create_time": psutil.Process(other.pid).create_time() - 1000}))
        assert running_from_state(state) is None
        assert stop_from_state(state) is None
        assert other.poll() is None and not state.exists()
        # an old server.json without a start time: the command line must name the program
        state.write_text(json.dumps({"server": "tritonserver", "pid": other.pid}))
        assert stop_from_state(state) is None and other.poll() is None
        # the recorded process itself is stopped
        state.write_text(json.dumps({"server": "tritonserver", "pid": other.pid,
                                     "create_time": psutil.Process(other.pid).create_time()}))
        assert running_from_state(state) is not None
        assert stop_from_state(state, timeout=5) is not None
        assert other.wait(timeout=10) is not None
    finally:
        if other.poll() is None:
            other.kill()


def test_query_sends_to_the_port_the_running_server_recorded(tmp_path):
    import json
    import os

    import psutil

    from builders.spec import load_spec
    from pipeline.cli import query_url
    from tests.conftest import DEFAULT_BUILD

    build = load_spec(DEFAULT_BUILD, "cpu")
    default = f"127.0.0.1:{build.settings.serving.grpc_port}"
    assert query_url(None, build, tmp_path) == default
    (tmp_path / "server.json").write_text(json.dumps({"server": "tritonserver", "pid": os.getpid(),
                                                      "create_time": psutil.Process().create_time(),
                                                      "grpc": "127.0.0.1:45678"}))
    assert query_url(None, build, tmp_path) == "127.0.0.1:45678"
    assert query_url("10.0.0.1:8001", build, tmp_path) == "10.0.0.1:8001"


def test_serve_that_fails_stops_the_frontend_it_started_beside_tritonserver(tmp_path, capsys):
    """`trtpipe serve` starts the OpenAI frontend while tritonserver loads its models; when tritonserver fails, the
    frontend it started goes too (its port is free again, no process of it left)."""
    import psutil

    from pipeline.cli import main

    out, repo = tmp_path / "out", tmp_path / "repo"
    (out / "smollm2-135m" / "cpu").mkdir(parents=True)
    for model in ("ensemble", "tensorrt_llm"):  # configs tritonserver refuses at once (no platform or backend)
        (repo / model).mkdir(parents=True)
        (repo / model / "config.pbtxt").write_text(f'name: "{model}"\n')
    ports = free_ports(4)
    argv = ["serve", "--out", str(out), "--model-repo", str(repo), "--timeout", "120"]
    for flag, port in zip(("--http-port", "--grpc-port", "--metrics-port", "--openai-port"), ports):
        argv += [flag, str(port)]
    before = {p.pid for p in psutil.process_iter()}
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "tritonserver exited" in err or "not READY" in err, err
    assert (repo.parent / "openai_frontend.log").is_file()  # started before tritonserver was READY
    left = [p for p in psutil.process_iter(["pid", "cmdline"]) if p.pid not in before
            and "pipeline.openai_frontend" in " ".join(p.info["cmdline"] or []) and str(ports[3]) in p.info["cmdline"]]
    assert not left, [p.info["cmdline"] for p in left]
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[3]))  # the frontend's port is free again
