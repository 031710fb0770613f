"""The lifecycle of the servers ``trtpipe serve`` runs: start, wait until ready, diagnose, stop.

tritonserver (:class:`TritonServer`) on a model repository, ready when every model is READY; TensorRT-LLM's
``trtllm-serve`` (:class:`TrtllmServe`, whatever ``shutil.which("trtllm-serve")`` finds) on a trtllm-llmapi build,
ready when ``/health`` answers 200; the OpenAI frontend (:class:`OpenAIFrontend`) beside tritonserver. The
tritonserver binary comes from the ``nvidia-pytriton`` wheel, installed by ``make setup`` into ``.triton/`` (or
``$TRTPIPE_TRITONSERVER``). Before starting: the ports must be free, the Python-backend stub matching this
interpreter is put in place, and the repository exists. Servers listen on 127.0.0.1 unless told otherwise.
Failures are reported with the failing model's log lines and, where a known pattern matches, the fix.

Elsewhere: the command lines (model_repo.launch), what trtllm-serve and the frontend are launched with
(pipeline.launch_config), the failure tables (pipeline.server_failures), server.json, stopping a recorded server
and reaping what a dead one left (pipeline.server_state).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from builders.spec import default_port
from model_repo.launch import redacted, server_argv
from pipeline.launch_config import TRTLLM_SERVE, FrontendLaunch, TrtllmServeConfig
from pipeline.server_failures import TRTLLM_SERVE_FAILURES, ServerError, _failing_lines, diagnose
from pipeline.server_state import TRITONSERVER, _merge_reaped, reap_orphans, terminate_server
from plugins.errors import PipelineError
from plugins.fsutil import project_root
from plugins.procenv import passive_openmp
from plugins.runtimes import openai_server_releases

log = logging.getLogger("trtpipe")

TRITON_HOME = Path(os.environ.get("TRTPIPE_TRITON_HOME") or project_root() / ".triton" / "pytriton" / "tritonserver")

@dataclass
class ServerConfig:
    """How to launch one tritonserver."""

    model_repository: Path
    http_port: int = default_port("http_port")
    grpc_port: int = default_port("grpc_port")
    metrics_port: int = default_port("metrics_port")
    address: str = "127.0.0.1"
    log_file: Path | None = None
    ready_timeout_s: float = 600.0
    extra_args: list[str] = field(default_factory=list)
    python_path: list[str] = field(default_factory=list)
    world_size: int = 1
    """Ranks (tp x pp); under the mpirun launcher one tritonserver per GPU."""
    launcher: str = "tritonserver"
    """The runtime's launcher (plugins.runtimes.Runtime.launcher): ``tritonserver`` or ``mpirun`` (leader mode)."""

    @property
    def http_url(self) -> str:
        return f"{self.address}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.address}:{self.grpc_port}"


CHECKOUT_TRITON = Path(__file__).resolve().parents[1] / ".triton" / "pytriton" / "tritonserver"
"""Where ``make setup`` put tritonserver in the checkout this trtpipe runs from (found there when trtpipe runs from
another directory, as the build's own ``next:`` line suggests)."""


def tritonserver_binary() -> Path:
    """Path of the tritonserver executable: ``$TRTPIPE_TRITONSERVER``, else under :data:`TRITON_HOME`, else under the
    checkout's ``.triton/`` (:data:`CHECKOUT_TRITON`); raises ServerError with the install command when absent."""
    env = os.environ.get("TRTPIPE_TRITONSERVER")
    if env:
        candidates = [Path(env)]
    else:
        candidates = [TRITON_HOME / "bin" / "tritonserver"]
        if not os.environ.get("TRTPIPE_TRITON_HOME"):
            candidates.append(CHECKOUT_TRITON / "bin" / "tritonserver")
    for path in candidates:
        if path.is_file():
            return path
    raise ServerError(f"tritonserver not found at {' or '.join(map(str, dict.fromkeys(candidates)))}: run `make "
                      "setup` in the trtpipe checkout (installs nvidia-pytriton==0.7.0 with --no-deps into .triton/), "
                      "or set TRTPIPE_TRITONSERVER to the binary")


def ensure_python_stub(backends: Path) -> None:
    """Put the Python-backend stub for this interpreter's version into ``backends/python``."""
    stub = backends / "python" / "triton_python_backend_stub"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    src = backends.parent / "python_backend_stubs" / ver / "triton_python_backend_stub"
    marker = backends / "python" / ".stub_version"
    if stub.is_file() and marker.is_file() and marker.read_text() == ver:
        return
    if not src.is_file():
        raise ServerError(f"no Python-backend stub for Python {ver} in {src.parent.parent}: use Python 3.8-3.13")
    shutil.copy2(src, stub)
    stub.chmod(0o755)
    marker.write_text(ver)


def port_free(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def check_ports(cfg: ServerConfig, frontend: FrontendLaunch | None = None) -> None:
    """Refuse a launch whose ports are taken or repeated: tritonserver's three (``cfg``) and, when given, the OpenAI
    frontend's. Checked before anything starts: the frontend's port, checked only when it started, failed the
    launch after tritonserver's tens of seconds of model loading.

    Raises:
        ServerError: a port is named twice, or another process holds one (each named with its option).
    """
    ports = [("--http-port", cfg.http_port, cfg.address), ("--grpc-port", cfg.grpc_port, cfg.address),
             ("--metrics-port", cfg.metrics_port, cfg.address)]
    if frontend is not None:
        ports.append(("--openai-port", frontend.port, frontend.address))
    seen: dict[int, str] = {}
    for flag, port, _ in ports:
        if port in seen:
            raise ServerError(f"{seen[port]} and {flag} are both {port}: each listener needs its own port; pass "
                              "another to one of them")
        seen[port] = flag
    busy = [(flag, port, address) for flag, port, address in ports if not port_free(port, address)]
    if busy:
        raise ServerError(f"port(s) {[p for _, p, _ in busy]} on {busy[0][2]} already in use ("
                          + ", ".join(f"{flag} {port}" for flag, port, _ in busy)
                          + "): stop the process holding them (`trtpipe stop` if it is a server of this build) or "
                          "choose other ports (" + ", ".join(flag for flag, _, _ in busy)
                          + (", or --no-openai" if any(f == "--openai-port" for f, _, _ in busy) else "") + ")")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free on 127.0.0.1 right now (for tests and parallel servers)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def check_shm(min_bytes: int = 256 * 2**20) -> str | None:
    """A warning when /dev/shm has less than ``min_bytes`` free, else None."""
    with contextlib.suppress(OSError):
        st = os.statvfs("/dev/shm")
        free = st.f_bavail * st.f_frsize
        if free < min_bytes:
            return f"/dev/shm has {free / 2**20:.0f} MiB free; Python models need >= 64 MiB each"
    return None


def visible_gpus() -> int | None:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else ``nvidia-smi -L``; None if unknown."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([d for d in env.split(",") if d.strip() and d.strip() != "-1"])
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return len([ln for ln in out.splitlines() if ln.startswith("GPU ")])


def check_gpus(cfg: ServerConfig) -> None:
    """Refuse to start a multi-GPU or trtllm launch when fewer GPUs are visible than ranks."""
    if cfg.launcher != "mpirun" and cfg.world_size <= 1:
        return
    require_gpus(cfg.world_size)


def require_gpus(world_size: int) -> None:
    """Raise ServerError unless at least ``world_size`` GPUs are visible (:func:`visible_gpus`)."""
    n = visible_gpus()
    if n is None or n < world_size:
        seen = "no GPU (nvidia-smi missing)" if n is None else f"{n} GPU(s)"
        raise ServerError(f"world_size tp x pp = {world_size} needs {world_size} GPU(s), this host shows "
                          f"{seen} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): run on a host "
                          "with enough GPUs, or lower parallelism.tp_size/pp_size and rebuild")


def command(cfg: ServerConfig) -> list[str]:
    """The tritonserver command line for ``cfg`` (model_repo.launch.server_argv: one process, or the leader-mode
    mpirun of the GPU-host bundle's script) with this host's binary and backends, INFO lines in the log."""
    binary = tritonserver_binary()
    return server_argv(cfg.launcher, cfg.world_size, str(cfg.model_repository), http_port=cfg.http_port,
                       grpc_port=cfg.grpc_port, metrics_port=cfg.metrics_port, address=cfg.address,
                       tritonserver=str(binary), backend_directory=str(binary.parent.parent / "backends"),
                       log_info=True, extra=cfg.extra_args)


def repository_device(model_repository: Path) -> str | None:
    """The device the repository's tensorrt_llm model serves on ("cpu", "cuda"; the C++ tensorrtllm
    backend: "cuda"), or None when its config does not say."""
    from model_repo.generate import parse_config

    path = model_repository / "tensorrt_llm" / "config.pbtxt"
    try:
        cfg = parse_config(path.read_text(), str(path))
    except (OSError, PipelineError):
        return None
    if cfg.backend == "tensorrtllm":
        return "cuda"
    return cfg.parameters["device"].string_value if "device" in cfg.parameters else None


def server_environment(environ) -> dict:
    """The environment tritonserver starts with: ``environ`` with every virtualenv's ``bin`` folder taken
    off PATH, and OpenMP threads passive (plugins.procenv) unless ``environ`` says otherwise.

    Why: the Python-backend stub embeds the libpython it was linked against and, like any embedded
    CPython, takes its prefix (where the standard library lives) from the first ``python3`` on PATH
    (CPython's getpath: a ``pyvenv.cfg`` beside that executable names its home). With an activated
    virtualenv of another CPython build first on PATH, the stub loads that build's standard library
    and the models fail to load with "undefined symbol" in ``lib-dynload``. Packages reach the stub
    through TRTPIPE_PYTHONPATH, not PATH, so nothing else is lost.
    """
    env = passive_openmp(dict(environ))  # the models' processes (the pytorch runtime's engine worker) run torch
    keep, dropped = [], []
    for d in env.get("PATH", "").split(os.pathsep):
        (dropped if d and (Path(d).parent / "pyvenv.cfg").is_file() else keep).append(d)
    if dropped:
        log.debug("tritonserver's PATH leaves out virtualenv folders: %s", ", ".join(dropped))
        env["PATH"] = os.pathsep.join(keep)
    return env


class _ServerProcess:
    """What every server trtpipe starts shares: its process, its log file, how it is stopped (context manager:
    ``start()`` on entry, :meth:`stop` on exit)."""

    program = "server"

    def __init__(self, log_path: Path):
        self.proc: subprocess.Popen | None = None
        self.log_path = log_path
        self.started_at: float | None = None  # time.time() at the spawn (reap_orphans' since)

    def _launch(self, argv: list[str], env: dict, detach: bool, wait: bool = True):
        """Spawn ``argv`` and (``wait``) wait until the server is ready (:meth:`wait_ready`); stop it on any
        failure."""
        self._spawn(argv, env, detach)
        if not wait:
            return self
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_http_200(self, url: str, timeout_s: float, period_s: float) -> bool:
        """Poll ``GET url`` until it answers 200 (True) or ``timeout_s`` passes (False); raise through
        :meth:`_raise` when the process exits first."""
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                self._raise(f"{self.program} exited with status {self.proc.returncode} before {url} answered 200")
            with contextlib.suppress(urllib.error.URLError, OSError):
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200:
                        return True
            time.sleep(period_s)
        return False

    def _spawn(self, argv: list[str], env: dict, detach: bool) -> None:
        """Start ``argv`` with stdout and stderr into the log file; ``detach``: in its own session, so it outlives
        this process."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as logf:
            log.info("starting %s: %s", self.program, shlex.join(redacted(argv)))  # no key in the log
            self.started_at = time.time()
            self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=detach)

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 40.0) -> dict:
        """Stop the server and every process it started (see :func:`terminate_server`)."""
        if self.proc is None:
            return {"forced": False, "stubs_killed": 0}
        if self.proc.poll() is not None:  # it died (crashed or killed): what it started may still run
            return {"forced": False, "stubs_killed": 0, "exit_code": self.proc.returncode, **self._reap()}
        result = terminate_server(self.proc.pid, timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)  # reap
        return _merge_reaped(result, self._reap())

    def _reap(self) -> dict:
        """reap_orphans for this server's repository (other servers only: no-op)."""
        repo = getattr(getattr(self, "cfg", None), "model_repository", None)
        return reap_orphans(repo, self.started_at) if repo is not None else {}

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


class TritonServer(_ServerProcess):
    """A running tritonserver process (context manager: starts, waits for READY, stops)."""

    program = TRITONSERVER

    def __init__(self, cfg: ServerConfig):
        super().__init__(cfg.log_file or (cfg.model_repository.parent / "tritonserver.log"))
        self.cfg = cfg

    def start(self, detach: bool = False, wait: bool = True) -> "TritonServer":
        """Check the repository, ports, shared memory and GPUs, spawn tritonserver and (``wait``) wait until every
        model is READY (else the caller calls :meth:`wait_ready`).

        Raises:
            ServerError: not a trtpipe repository, a port taken, too few GPUs, or (``wait``) not ready in time.
        """
        cfg = self.cfg
        if not (cfg.model_repository / "ensemble" / "config.pbtxt").is_file():
            raise ServerError(f"{cfg.model_repository} is not a model repository built by trtpipe "
                              "(ensemble/config.pbtxt missing): run `trtpipe build` first")
        check_ports(cfg)  # again, when the caller checked the frontend's with them (pipeline.cli: serve)
        shm = check_shm()
        if shm:
            log.warning(shm)
        check_gpus(cfg)
        binary = tritonserver_binary()
        ensure_python_stub(binary.parent.parent / "backends")
        env = server_environment(os.environ)
        if cfg.python_path:
            env["TRTPIPE_PYTHONPATH"] = os.pathsep.join(cfg.python_path)
        return self._launch(command(cfg), env, detach, wait)

    def state(self) -> dict:
        """What :func:`write_state` records for this server."""
        return {"server": self.program, "pid": self.proc.pid, "http": self.cfg.http_url, "grpc": self.cfg.grpc_url,
                "metrics_port": self.cfg.metrics_port, "model_repository": str(self.cfg.model_repository),
                "log": str(self.log_path)}

    def wait_ready(self) -> None:
        """Block until the server and every model in the repository are READY, or raise ServerError."""
        import tritonclient.grpc as grpcclient  # the client protocol of everything else here

        models = sorted(p.name for p in self.cfg.model_repository.iterdir() if (p / "config.pbtxt").is_file())
        client = grpcclient.InferenceServerClient(self.cfg.grpc_url)
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        last_state: dict = {}
        try:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    self._raise(f"tritonserver exited with status {self.proc.returncode} before becoming ready")
                with contextlib.suppress(Exception):
                    if client.is_server_live(client_timeout=5.0):
                        last_state = {m: client.is_model_ready(m, client_timeout=5.0) for m in models}
                        if all(last_state.values()) and client.is_server_ready(client_timeout=5.0):
                            log.info("tritonserver ready: %s (HTTP %s, gRPC %s, metrics :%d)", ", ".join(models),
                                     self.cfg.http_url, self.cfg.grpc_url, self.cfg.metrics_port)
                            return
                time.sleep(0.5)
        finally:
            client.close()
        not_ready = [m for m, ok in last_state.items() if not ok] or models
        self._raise(f"models {not_ready} not READY after {self.cfg.ready_timeout_s:.0f} s")

    def _raise(self, headline: str) -> None:
        text = self._log_text()
        device = repository_device(self.cfg.model_repository)
        gpu = None if device is None else device != "cpu"
        hints = diagnose(text, gpu)
        msg = [headline, f"log: {self.log_path}", "relevant log lines:", _failing_lines(text, gpu=gpu)]
        if hints:
            msg += ["suggested fixes:"] + [f"  - {h}" for h in hints]
        raise ServerError("\n".join(msg))


class TrtllmServe(_ServerProcess):
    """A running trtllm-serve, TensorRT-LLM's OpenAI-compatible server (context manager: starts, waits for
    ``/health``, stops). Readiness, death and timeout are reported as for tritonserver: ServerError with the log's
    last lines and the fixes of :data:`TRTLLM_SERVE_FAILURES` that match."""

    program = TRTLLM_SERVE

    def __init__(self, cfg: TrtllmServeConfig):
        super().__init__(cfg.log_file or (cfg.checkpoint.parent / f"{TRTLLM_SERVE}.log"))
        self.cfg = cfg

    @staticmethod
    def executable() -> str | None:
        """The trtllm-serve on PATH, or None where TensorRT-LLM is not installed."""
        return shutil.which(TRTLLM_SERVE)

    def start(self, detach: bool = False) -> "TrtllmServe":
        """Start it and wait until ``GET /health`` answers 200 (at most ``cfg.ready_timeout_s`` seconds).

        Raises:
            ServerError: trtllm-serve is not on PATH; the port is taken; fewer GPUs than tp x pp are visible; it
                exited or did not answer in time (then it is stopped).
        """
        cfg = self.cfg
        exe = self.executable()
        if exe is None:
            raise ServerError(f"{TRTLLM_SERVE} is not on PATH: install TensorRT-LLM "
                              f"{openai_server_releases(TRTLLM_SERVE).first_text} or later, or run "
                              f"`{shlex.join(cfg.argv)}` in {cfg.image} on a GPU host")
        if not port_free(cfg.http_port, cfg.address):
            raise ServerError(f"port {cfg.http_port} on {cfg.address} already in use: stop the process holding it "
                              "(`trtpipe stop`) or choose another (--http-port)")
        require_gpus(cfg.world_size)
        return self._launch([exe, *cfg.argv[1:]], dict(os.environ), detach)

    def wait_ready(self) -> None:
        """Block until ``GET /health`` answers 200 while the process lives, or raise ServerError."""
        url = self.cfg.health_url
        if self._wait_http_200(url, self.cfg.ready_timeout_s, 0.5):
            log.info("%s ready: %s (OpenAI API under /v1)", TRTLLM_SERVE, url)
            return
        self._raise(f"{TRTLLM_SERVE} did not answer 200 on {url} within {self.cfg.ready_timeout_s:.0f} s (a large "
                    "checkpoint may need longer: --timeout)")

    def _raise(self, headline: str, tail: int = 30) -> None:
        text = self._log_text()
        hints = diagnose(text, failures=TRTLLM_SERVE_FAILURES)
        msg = [headline, f"command: {shlex.join(self.cfg.argv)}", f"log: {self.log_path}",
               "last log lines:\n" + ("\n".join(text.splitlines()[-tail:]) or "(empty)")]
        if hints:
            msg += ["suggested fixes:"] + [f"  - {h}" for h in hints]
        raise ServerError("\n".join(msg))

    def state(self) -> dict:
        """What :func:`write_state` records for this server."""
        return {"server": self.program, "pid": self.proc.pid, "http": f"{self.cfg.address}:{self.cfg.http_port}",
                "health": self.cfg.health_url, "command": self.cfg.argv, "log": str(self.log_path)}


class OpenAIFrontend(_ServerProcess):
    """The OpenAI-compatible frontend process (uvicorn), ready when its ``/health`` answers 200 (Triton ready)."""

    program = "openai-frontend"

    def __init__(self, launch: FrontendLaunch):
        super().__init__(launch.log_file or Path("openai_frontend.log"))
        self.launch = launch

    def start(self, detach: bool = False, wait: bool = True) -> "OpenAIFrontend":
        """Start it and (``wait``) wait for ``/health`` (else the caller calls :meth:`wait_ready`).

        Raises:
            ServerError: the port is taken, or it exited or did not answer in time (then it is stopped).
        """
        if not port_free(self.launch.port, self.launch.address):
            raise ServerError(f"port {self.launch.port} on {self.launch.address} already in use (the OpenAI "
                              "frontend's): stop the process holding it, or pass --openai-port, or --no-openai")
        return self._launch(self.launch.argv(), dict(os.environ), detach, wait)

    def wait_ready(self) -> None:
        """Block until ``GET /health`` answers 200 (Triton ready behind it), or raise ServerError."""
        url = self.launch.url + "/health"
        if self._wait_http_200(url, self.launch.ready_timeout_s, 0.3):
            return
        self._raise(f"the OpenAI frontend did not answer 200 on {url} within {self.launch.ready_timeout_s:.0f} s")

    def _raise(self, headline: str) -> None:
        tail = "\n".join(self._log_text().splitlines()[-30:]) or "(empty)"
        raise ServerError(f"{headline}\nlog: {self.log_path}\nlast log lines:\n{tail}")

    def state(self) -> dict:
        return {"pid": self.proc.pid, "url": self.launch.url, "log": str(self.log_path)}

