"""`trtpipe serve` / `status` before anything starts: every port is checked first (the OpenAI frontend's too), a
request that differs from the server of the build already running is refused with each difference and what to do,
the same request is "already serving", and a recorded server that has died (a zombie included) is noticed, with
what it left running. The recorded servers here are real processes standing in for tritonserver (server.json
names their pid and start time); nothing here starts tritonserver."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pipeline.cli import main
from pipeline.serve import free_ports

SLEEP = "import time; time.sleep(600)"


def _repo(path: Path) -> Path:
    """The files `serve` reads before it starts anything (a model repository's config.pbtxt files)."""
    for model in ("ensemble", "tensorrt_llm", "preprocessing"):
        (path / model).mkdir(parents=True)
        (path / model / "config.pbtxt").write_text(f'name: "{model}"\n')
    return path


@pytest.fixture
def layout(tmp_path):
    """(out root, the build folder under it, a repository, ports {flag: port})."""
    out = tmp_path / "out"
    folder = out / "smollm2-135m" / "cpu"
    folder.mkdir(parents=True)
    ports = dict(zip(("--http-port", "--grpc-port", "--metrics-port", "--openai-port"), free_ports(4)))
    return out, folder, _repo(tmp_path / "repo"), ports


def _argv(verb, out, repo=None, ports=None):
    return [verb, "--out", str(out), *(["--model-repo", str(repo)] if repo else []),
            *[a for flag, port in (ports or {}).items() for a in (flag, str(port))]]


def _record(folder: Path, proc, repo: Path, ports: dict) -> dict:
    """server.json as `serve` writes it, for ``proc`` standing in for tritonserver."""
    state = {"server": "tritonserver", "pid": proc.pid, "http": f"127.0.0.1:{ports['--http-port']}",
             "grpc": f"127.0.0.1:{ports['--grpc-port']}", "metrics_port": ports["--metrics-port"],
             "model_repository": str(repo), "log": str(repo.parent / "tritonserver.log"),
             "create_time": psutil.Process(proc.pid).create_time(),
             "openai": {"pid": proc.pid, "url": f"http://127.0.0.1:{ports['--openai-port']}", "log": "x",
                        "create_time": psutil.Process(proc.pid).create_time()}}
    (folder / "server.json").write_text(json.dumps(state))
    return state


def _sleeper(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLEEP, *args])


def test_serve_refuses_a_taken_openai_port_before_starting_tritonserver(layout, capsys):
    out, folder, repo, ports = layout
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports["--openai-port"]))
        s.listen()
        t0 = time.monotonic()
        assert main(_argv("serve", out, repo, ports)) == 2
    err = capsys.readouterr().err
    assert f"--openai-port {ports['--openai-port']}" in err and "already in use" in err and "--no-openai" in err
    assert not (repo.parent / "tritonserver.log").exists(), "tritonserver was started before the port was checked"
    assert not (folder / "server.json").exists()
    assert time.monotonic() - t0 < 60  # (generous: a refusal, not a model load)


def test_serve_refuses_one_port_named_twice(layout, capsys):
    out, _, repo, ports = layout
    ports["--openai-port"] = ports["--http-port"]
    assert main(_argv("serve", out, repo, ports)) == 2
    assert "--http-port and --openai-port are both" in capsys.readouterr().err
    assert not (repo.parent / "tritonserver.log").exists()


def test_serve_of_another_repository_while_the_build_is_served_is_refused_saying_how(layout, tmp_path, capsys):
    out, folder, repo, ports = layout
    other = _repo(tmp_path / "other")
    server = _sleeper()
    try:
        state = _record(folder, server, repo, ports)
        assert main(_argv("serve", out, other, ports)) == 2
        err = capsys.readouterr().err
        assert f"model repository: running {repo.resolve()}, asked {other.resolve()}" in err
        assert "Stop it first (`" in err and " stop --out " in err and "nothing was started" in err
        assert server.poll() is None and json.loads((folder / "server.json").read_text()) == state
        # other ports, or no frontend: refused too, each difference named
        moved = {**ports, "--grpc-port": free_ports(1)[0]}
        assert main(_argv("serve", out, repo, moved)) == 2
        assert f"gRPC address: running 127.0.0.1:{ports['--grpc-port']}" in capsys.readouterr().err
        assert main(_argv("serve", out, repo, ports) + ["--no-openai"]) == 2
        assert "OpenAI frontend: running http://127.0.0.1" in capsys.readouterr().err
        # the same request: already serving, exit 0 (make serve twice)
        assert main(_argv("serve", out, repo, ports)) == 0
        assert "already serving" in capsys.readouterr().out
        assert main(_argv("status", out)) == 0
        assert f"serving: tritonserver (pid {server.pid}" in capsys.readouterr().out
    finally:
        server.kill()
        server.wait(10)


def test_status_and_serve_notice_a_dead_server_and_what_it_left(layout, capsys):
    out, folder, repo, ports = layout
    server = _sleeper()
    stub = _sleeper(str(repo.resolve() / "tensorrt_llm" / "1" / "model.py"))  # runs from the repository, as a stub
    try:
        _record(folder, server, repo, ports)
        server.kill()  # a zombie from here on (not reaped): the pid and its start time still answer
        deadline = time.monotonic() + 30
        while psutil.Process(server.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert main(_argv("status", out)) == 1
        said = capsys.readouterr().out
        assert f"not serving: the recorded tritonserver (pid {server.pid}) has exited" in said
        assert str(stub.pid) in said
        from pipeline.cli import _already_serving, make_parser

        args = make_parser().parse_args(_argv("serve", out, repo, ports))
        assert _already_serving(args, folder / "server.json", {"server": "tritonserver"}) is False
        said = capsys.readouterr().out
        assert "had exited (crashed or killed" in said and "removed what it left: 1 process(es)" in said
        assert stub.wait(30) is not None and not (folder / "server.json").exists()
        assert main(_argv("status", out)) == 1
        assert "no server recorded" in capsys.readouterr().out
    finally:
        for p in (server, stub):
            p.kill()
            p.wait(10)
