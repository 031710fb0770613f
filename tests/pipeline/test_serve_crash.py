"""`kill -9` of tritonserver mid-generation, served as `trtpipe serve --detach` serves it (real tritonserver, its
Python-backend stubs, the engine worker, the OpenAI frontend): nothing of it keeps running, and `trtpipe status`
says the server has exited. Before, the stubs, the worker and the frontend ran on until `trtpipe stop`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psutil
import pytest

from pipeline.serve import free_ports
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

DEADLINE_S = 60.0
"""Most seconds any process of the server may outlive tritonserver's kill."""

# Runs `trtpipe serve --detach` (argv[2:]) as a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so the server it
# leaves behind becomes this process's child, then prints serve's exit status; argv[1] "reap": reaps each child
# that exits, as init does; "zombie": never does, as an init that does not reap (a container's PID 1).
HOLDER = """
import ctypes, os, subprocess, sys, time
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
print(subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL), flush=True)
while True:
    try:
        if sys.argv[1] == "reap":
            os.wait()
        else:
            time.sleep(1)
    except ChildProcessError:
        time.sleep(0.1)
"""


def _alive(procs: list) -> list:
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _zombie(proc) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stream(url: str, first: threading.Event, log: list) -> None:
    """One long streamed chat completion; sets ``first`` at its first chunk."""
    body = json.dumps({"model": "smollm2-135m", "stream": True, "max_tokens": 1500, "temperature": 0,
                       "messages": [{"role": "user", "content": "Tell me a very long story."}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            for line in resp:
                if line.startswith(b"data: "):
                    first.set()
                    log.append(line)
    except Exception as exc:  # the server died mid-stream: expected
        log.append(repr(exc))
    finally:
        first.set()


@pytest.mark.parametrize("parent", ["reap", "zombie"])
def test_kill_9_of_tritonserver_mid_generation_leaves_nothing_running(built_default, tmp_path, parent):
    repo = tmp_path / "model_repo"
    shutil.copytree(built_default / "model_repo", repo)
    out = tmp_path / "out"
    folder = out / "smollm2-135m" / "cpu"
    folder.mkdir(parents=True)
    (folder / "engine").symlink_to(built_default / "engine")  # the frontend's tokenizer
    http, grpc, metrics, openai = free_ports(4)
    cli = [sys.executable, "-m", "pipeline.cli"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, parent, *cli, "serve", "--detach", "--out", str(out),
                               "--model-repo", str(repo), "--http-port", str(http), "--grpc-port", str(grpc),
                               "--metrics-port", str(metrics), "--openai-port", str(openai), "--timeout", "300"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=open(tmp_path / "serve.err", "w"),
                              text=True)
    tree = []
    try:
        rc = holder.stdout.readline().strip()
        assert rc == "0", f"serve: {rc}: {(tmp_path / 'serve.err').read_text()}"
        state = json.loads((folder / "server.json").read_text())
        triton = psutil.Process(state["pid"])
        assert triton.ppid() == holder.pid  # orphaned to the holder, as to init
        tree = triton.children(recursive=True) + [psutil.Process(state["openai"]["pid"])]
        names = " ".join(" ".join(p.cmdline()) for p in tree)
        assert "engine_worker.py" in names and "triton_python_backend_stub" in names and "openai_frontend" in names
        first, log = threading.Event(), []
        streaming = threading.Thread(target=_stream, args=(f"http://127.0.0.1:{openai}", first, log), daemon=True)
        streaming.start()
        assert first.wait(180) and log and log[0].startswith(b"data: "), log  # generating
        os.kill(triton.pid, signal.SIGKILL)  # the holder reaps it, or it stays a zombie
        deadline = time.monotonic() + DEADLINE_S
        while _alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"tree of {len(tree)} process(es); alive {time.monotonic() - deadline + DEADLINE_S:.1f} s after the "
              f"kill: {[p.pid for p in _alive(tree)]}; tritonserver a zombie: {bool(_zombie(triton))}")
        left = [(p.pid, " ".join(p.cmdline())[:300]) for p in _alive(tree)]
        assert not left, f"still running {DEADLINE_S:.0f} s after tritonserver's kill -9: {left}"
        status = subprocess.run(cli + ["status", "--out", str(out)], cwd=REPO, env=env, capture_output=True,
                                text=True, timeout=120)
        assert status.returncode == 1 and f"(pid {triton.pid}) has exited" in status.stdout, status.stdout
        assert "still running" not in status.stdout
    finally:
        for p in _alive(tree):
            p.kill()
        subprocess.run(cli + ["stop", "--out", str(out)], cwd=REPO, env=env, capture_output=True, timeout=120)
        holder.kill()
        holder.communicate(timeout=30)
