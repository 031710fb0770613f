"""``trtpipe serve --server trtllm-serve``: the build is checked, trtllm-serve runs the deployment files' command on
this host's address and port, readiness is ``GET /health`` answering 200, death and timeouts come back with the
log's last lines and a diagnosis, ``trtpipe stop`` stops it; where trtllm-serve is absent the command is printed.

TensorRT-LLM cannot be installed here: where a test needs trtllm-serve to run, the double tests/doubles/trtllm_serve.py
(options from tests/facts/trtllm_1_2_1/llm_args.json) is put on PATH as ``trtllm-serve``, the way a real install
is found. ``CUDA_VISIBLE_DEVICES=0`` makes the product's GPU check see one GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
import yaml

from builders.layout import build_dir
from builders.llmapi_options import llm_api_options, options_yaml
from builders.spec import load_spec
from model_repo.deploy import runtime_image
from model_repo.launch import trtllm_serve_argv
from pipeline.cli import EXIT_NOT_INSTALLED, main
from pipeline.launch_config import trtllm_serve_config
from pipeline.serve import TrtllmServe, free_ports
from pipeline.server_failures import TRTLLM_SERVE_FAILURES, ServerError, diagnose
from plugins.errors import SpecError
from tests.conftest import ASSETS, REPO, write_spec
from tests.doubles import trtllm_serve as double

FACTS = {v: json.loads((REPO / "tests" / "facts" / d / "llm_args.json").read_text())["trtllm_serve"]
         for v, d in (("1.2.1", "trtllm_1_2_1"), ("1.4", "trtllm_1_4"))}
TARGET = "h100"


@pytest.fixture
def llmapi(tmp_path):
    """A trtllm-llmapi build folder as the build writes it, as far as trtllm-serve reads it: engine/config.json and
    the generated options YAML. Returns (spec path, out root, build, folder)."""
    spec = write_spec(tmp_path / "b.yaml", tmp_path / "model", target=TARGET, runtime="trtllm-llmapi",
                      extra="    parallelism: {tp_size: 1, pp_size: 1}\n")
    build = load_spec(spec, TARGET)
    root = tmp_path / "out"
    folder = build_dir(build, root)
    (folder / "engine").mkdir(parents=True)
    shutil.copy2(ASSETS / "smollm2-135m" / "config.json", folder / "engine" / "config.json")
    options = folder / "model_repo" / "tensorrt_llm" / "1" / "llm_api_options.yaml"
    options.parent.mkdir(parents=True)
    options.write_text(options_yaml(llm_api_options(build), build))
    return spec, root, build, folder


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """The trtllm-serve double installed as ``trtllm-serve`` first on PATH; one GPU visible."""
    exe = double.install(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    for knob in ("TRTPIPE_SERVE_DOUBLE_DIE", "TRTPIPE_SERVE_DOUBLE_DELAY", "TRTPIPE_SERVE_DOUBLE_ARGV"):
        monkeypatch.delenv(knob, raising=False)
    return exe


@pytest.fixture
def no_trtllm_serve(tmp_path, monkeypatch):
    """PATH without any trtllm-serve (as on this machine)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{empty}{os.pathsep}{os.path.dirname(shutil.which('bash'))}")
    assert shutil.which("trtllm-serve") is None


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status
    except OSError:
        return None


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def _stopped(server: TrtllmServe):
    """Stop ``server`` on the way out, also when the product left it running."""
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)


def _kill_doubles_serving(folder) -> None:
    """Kill any trtllm-serve double this test started on ``folder`` (a detached one is not our child's child)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if any(a.endswith("trtllm_serve.py") for a in cmd) and f"{folder.resolve()}/engine" in cmd:
            with contextlib.suppress(psutil.Error):
                proc.kill()


# ---- the double is 1.2.1's command line, no more -------------------------------------------------------------------

def test_double_takes_exactly_1_2_1s_options(tmp_path):
    opts = FACTS["1.2.1"]["options"]
    for flag, f in opts.items():
        for name in [flag, *f.get("aliases", [])]:
            value = [] if f["type"].startswith("flag") else [
                "1" if f["type"] in ("int", "float") else "auto" if "'auto'" in f["type"] else
                "pytorch" if "'pytorch'" in f["type"] else "x"]
            double.parse(["serve", "m", name, *value])  # accepted
    only_1_4 = sorted(set(FACTS["1.4"]["options"]) - set(opts))
    assert only_1_4  # e.g. --served_model_name, --kv_cache_dtype
    for flag in only_1_4:
        with pytest.raises(double.UsageError, match=f"No such option: {flag}"):
            double.parse(["serve", "m", flag, "x"])
    with pytest.raises(double.UsageError):
        double.parse(["serve", "m", "--conf", "x"])  # click takes no abbreviations
    r = subprocess.run([sys.executable, double.__file__, "serve", "m", "--bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "Error: No such option: --bogus" in r.stderr


def test_the_products_command_is_one_the_double_takes(llmapi):
    _, _, build, folder = llmapi
    for host in ("0.0.0.0", "127.0.0.1"):
        args = double.parse(trtllm_serve_argv(build, str(folder), host=host)[1:])
        assert args.model == f"{folder}/engine" and args.host == host and args.extra_llm_api_options.endswith(
            "model_repo/tensorrt_llm/1/llm_api_options.yaml")


# ---- starting, readiness, death, timeout ---------------------------------------------------------------------------

def test_waits_for_health_then_serves_and_stops(llmapi, on_path, tmp_path, monkeypatch):
    _, _, build, folder = llmapi
    (port,) = free_ports(1)
    monkeypatch.setenv("TRTPIPE_SERVE_DOUBLE_DELAY", "1.5")  # "loading": nothing listens yet
    monkeypatch.setenv("TRTPIPE_SERVE_DOUBLE_ARGV", str(tmp_path / "argv.json"))
    cfg = trtllm_serve_config(build, folder, http_port=port, ready_timeout_s=60)
    assert cfg.argv == trtllm_serve_argv(build, str(folder.resolve()), host="127.0.0.1", port=port)  # one source
    assert cfg.health_url == f"http://127.0.0.1:{port}/health" and cfg.image == runtime_image(build.runtime)
    t0 = time.monotonic()
    with TrtllmServe(cfg) as server:
        assert time.monotonic() - t0 >= 1.5  # it waited for /health, not for the process to exist
        assert _health(cfg.health_url) == 200
        assert json.loads((tmp_path / "argv.json").read_text()) == cfg.argv[1:]
        assert "Uvicorn running" in server.log_path.read_text()
        pid = server.proc.pid
    assert _gone(pid) and _health(cfg.health_url) is None
    assert server.log_path == folder.resolve() / "trtllm-serve.log"


def test_death_at_start_gives_the_log_tail_and_the_diagnosis(llmapi, on_path, monkeypatch):
    _, _, build, folder = llmapi
    (port,) = free_ports(1)
    monkeypatch.setenv("TRTPIPE_SERVE_DOUBLE_DIE", "RuntimeError: CUDA error: no CUDA-capable device is detected")
    server = TrtllmServe(trtllm_serve_config(build, folder, http_port=port, ready_timeout_s=30))
    with _stopped(server), pytest.raises(ServerError) as err:
        server.start()
    msg = str(err.value)
    assert "trtllm-serve exited with status 1 before" in msg
    tail = msg.split("last log lines:\n")[1]
    assert "[TRT-LLM] [I] LLM args" in tail and "no CUDA-capable device is detected" in tail
    assert "suggested fixes:" in msg and "no GPU visible to trtllm-serve" in msg
    assert f"log: {server.log_path}" in msg and "command: trtllm-serve serve " in msg


def test_not_ready_in_time_is_an_error_and_the_server_is_stopped(llmapi, on_path, monkeypatch):
    _, _, build, folder = llmapi
    (port,) = free_ports(1)
    monkeypatch.setenv("TRTPIPE_SERVE_DOUBLE_DELAY", "120")
    server = TrtllmServe(trtllm_serve_config(build, folder, http_port=port, ready_timeout_s=1.5))
    with _stopped(server):
        with pytest.raises(ServerError, match=r"did not answer 200 on http://127.0.0.1:\d+/health within 2 s"):
            server.start()
        assert server.proc.poll() is not None  # not left running


def test_busy_port_and_missing_gpus_are_refused_before_starting(llmapi, on_path, monkeypatch):
    _, _, build, folder = llmapi
    (port,) = free_ports(1)
    cfg = trtllm_serve_config(build, folder, http_port=port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(ServerError, match=rf"port {port} on 127.0.0.1 already in use.*--http-port"):
            TrtllmServe(cfg).start()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    server = TrtllmServe(cfg)
    with pytest.raises(ServerError, match=r"needs 1 GPU\(s\), this host shows 0 GPU"):
        server.start()
    assert server.proc is None


def test_trtllm_serve_failures_are_recognised():
    lines = {  # what each component prints
        "address already in use": "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): "
                                  "address already in use",
        "out of memory": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "no CUDA-capable device": "RuntimeError: CUDA error: no CUDA-capable device is detected",
        "CUDA driver version is insufficient": "RuntimeError: CUDA driver version is insufficient for CUDA runtime "
                                               "version",
        "No module named": "ModuleNotFoundError: No module named 'tensorrt_llm'",
        "No such option": "Error: No such option: --config",
        "Extra inputs are not permitted": "pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                          "TorchLlmArgs\nfoo\n  Extra inputs are not permitted [type=extra_forbidden]",
    }
    assert set(lines) == {pat for pat, _ in TRTLLM_SERVE_FAILURES}
    for pat, line in lines.items():
        hints = diagnose(line, failures=TRTLLM_SERVE_FAILURES)
        assert hints and hints[0].startswith(repr(pat)), (pat, hints)
    assert "--http-port" in diagnose(lines["address already in use"], failures=TRTLLM_SERVE_FAILURES)[0]
    assert diagnose("INFO:     Uvicorn running", failures=TRTLLM_SERVE_FAILURES) == []


# ---- the command line ----------------------------------------------------------------------------------------------

def _serve(spec, root, *more):
    return main(["serve", str(spec), "--target", TARGET, "--out", str(root), "--server", "trtllm-serve", *more])


def test_detached_serve_is_recorded_and_stopped(llmapi, on_path, capsys):
    spec, root, _, folder = llmapi
    (port,) = free_ports(1)
    try:
        assert _serve(spec, root, "--detach", "--http-port", str(port), "--timeout", "60") == 0
        out = capsys.readouterr().out
        assert f"trtllm-serve ready on 127.0.0.1:{port}" in out
        state = json.loads((folder / "server.json").read_text())
        assert state["server"] == "trtllm-serve" and state["command"][0] == "trtllm-serve"
        assert _health(state["health"]) == 200
        assert _serve(spec, root, "--detach", "--http-port", str(port)) == 0  # a rerun finds it
        assert "already serving: trtllm-serve" in capsys.readouterr().out
        assert main(["stop", str(spec), "--target", TARGET, "--out", str(root)]) == 0
        assert "stopped trtllm-serve" in capsys.readouterr().out
        assert _gone(state["pid"]) and _health(state["health"]) is None and not (folder / "server.json").exists()
    finally:  # whatever failed above, no double outlives the test
        _kill_doubles_serving(folder)


def test_without_trtllm_serve_it_checks_and_prints_the_command(llmapi, no_trtllm_serve, capsys):
    spec, root, build, folder = llmapi
    rc = _serve(spec, root, "--http-port", "8123", "--address", "0.0.0.0")
    cap = capsys.readouterr()
    assert rc == EXIT_NOT_INSTALLED != 0
    expected = shlex.join(trtllm_serve_argv(build, str(folder.resolve()), host="0.0.0.0", port=8123))
    assert expected in cap.out.splitlines()  # exactly, on a line of its own
    assert runtime_image(build.runtime) in cap.out and "GPU host" in cap.out
    assert "docker-compose.trtllm-serve.yaml" in cap.out
    assert "not on PATH" in cap.err and "nothing was started" in cap.err
    assert not (folder / "server.json").exists() and not (folder / "trtllm-serve.log").exists()


def test_only_trtllm_llmapi_builds(tmp_path, capsys):
    spec = write_spec(tmp_path / "b.yaml", tmp_path / "model", target=TARGET, runtime="trtllm")
    rc = main(["serve", str(spec), "--target", TARGET, "--out", str(tmp_path), "--server", "trtllm-serve"])
    err = capsys.readouterr().err
    assert rc == 2 and "runtime 'trtllm'" in err and "--server triton" in err and "--runtime trtllm-llmapi" in err


def test_the_build_is_checked_before_anything_runs(llmapi, no_trtllm_serve, tmp_path, capsys):
    spec, root, build, folder = llmapi
    assert _serve(spec, root, "--grpc-port", "9001") == 2
    assert "--grpc-port" in capsys.readouterr().err
    # an edited copy of the repository, passed with --model-repo: its options file is the one checked and served
    copy = tmp_path / "edited"
    shutil.copytree(folder / "model_repo", copy)
    opts = copy / "tensorrt_llm" / "1" / "llm_api_options.yaml"
    data = yaml.safe_load(opts.read_text())
    opts.write_text(yaml.safe_dump({**data, "max_batch_sise": 4}))
    with pytest.raises(SpecError) as err:
        trtllm_serve_config(build, folder, model_repo=copy)
    assert "llm_api_options.max_batch_sise" in str(err.value) and "max_batch_size" in str(err.value)
    opts.write_text("- just\n- a list\n")
    with pytest.raises(ServerError, match="holds a list.*mapping"):
        trtllm_serve_config(build, folder, model_repo=copy)
    opts.write_text(yaml.safe_dump(data))
    assert trtllm_serve_config(build, folder, model_repo=copy).argv[-1] == str(opts.resolve())
    # no checkpoint: nothing to serve
    (folder / "engine" / "config.json").unlink()
    assert _serve(spec, root) == 2
    err = capsys.readouterr().err
    assert "engine/config.json" in err and f"trtpipe build {build.spec_path} --target {TARGET}" in err
