"""Launch tritonserver on a model repository and wait until every model is READY.

The server binary comes from the ``nvidia-pytriton`` wheel, installed by ``make setup`` into
``.triton/`` (or ``$TRTPIPE_TRITONSERVER``). Before starting: the ports must be free, the
Python-backend stub matching this interpreter is put in place, and the repository exists.
The server listens on 127.0.0.1 unless told otherwise. Failures are reported with the
failing model's log lines and, where a known pattern matches, the fix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from plugins.errors import PipelineError
from plugins.fsutil import project_root
from plugins.runtimes import leader_mode_argv

log = logging.getLogger("trtpipe")

TRITON_HOME = Path(os.environ.get("TRTPIPE_TRITON_HOME") or project_root() / ".triton" / "pytriton" / "tritonserver")

# Log patterns -> what to do about them.
KNOWN_FAILURES: tuple[tuple[str, str], ...] = (
    ("address already in use", "another process holds the port: stop it (`trtpipe stop`) or pass --http-port/"
                               "--grpc-port/--metrics-port"),
    ("No module named", "the Python models cannot import a package: run `make setup`, or set "
                        "TRTPIPE_PYTHONPATH to the site-packages folder holding torch/transformers/numpy<2"),
    ("cannot reshape array of size 0", "numpy 2.x reached the Python-backend stub: put numpy<2 first on "
                                       "TRTPIPE_PYTHONPATH"),
    ("gpt_model_path", "the engine folder named in tensorrt_llm/config.pbtxt is missing or incomplete: rebuild"),
    ("sdpa_backends =", "tensorrt_llm/config.pbtxt's sdpa_backends names an unknown attention kernel: use the "
                        "names the error lists, or 'auto' (docs/deploy.md)"),
    ("lib-dynload", "the Python-backend stub loaded another Python's standard library (an embedded "
                    "interpreter takes its prefix from the first python3 on PATH): put the python3 whose "
                    "libpython the stub uses first on PATH, or set PYTHONHOME to its prefix"),
    ("unable to create stub process", "the Python-backend stub could not start: check /dev/shm space (>= 64 MB "
                                      "per Python model instance) and that libpython of this Python is present"),
    ("failed to increase the shared memory pool size", "too little /dev/shm: mount a larger one "
                                                        "(docker: --shm-size=2g)"),
    ("out of memory", "the model or its KV pool does not fit: lower limits.max_batch_size/max_seq_len or "
                      "serving.max_tokens_in_paged_kv_cache"),
    ("Unknown logit_processor_kwargs", "the runtime's sampling processors and transformers disagree: regenerate "
                                       "the repository with this checkout (`trtpipe build`) and pin transformers"),
    ("no CUDA-capable device", "no GPU visible to the server: check CUDA_VISIBLE_DEVICES and the container's "
                               "--gpus / nvidia.com/gpu request"),
    ("CUDA driver version is insufficient", "the host driver is older than the container's CUDA: use the "
                                            "container release that matches the driver (NVIDIA's support matrix)"),
    ("Failed to deserialize cuda engine", "the engine was built by another TensorRT/TensorRT-LLM version than "
                                          "this server's: rebuild in the serving container's version"),
    ("MPI_Init", "the tensorrtllm backend runs under MPI: launch with `trtpipe serve` (mpirun, one rank per GPU)"),
    ("ORTE_ERROR_LOG", "mpirun could not start the ranks: run as a user mpirun allows (--allow-run-as-root "
                       "in containers) and check that every rank can see its GPU"),
    ("Unexpected inference output", "a model returned a tensor its config.pbtxt does not declare: regenerate "
                                    "the repository so templates and configs come from the same checkout"),
    ("model_transaction_policy", "decoupled setting and the model disagree: streaming needs decoupled: true "
                                 "(serving.streaming) and gRPC streaming or generate_stream on the client"),
)


class ServerError(PipelineError):
    """The server did not start, or a model did not become READY."""


@dataclass
class ServerConfig:
    """How to launch one tritonserver."""

    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
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


def tritonserver_binary() -> Path:
    """Path of the tritonserver executable; raises ServerError with the install command when absent."""
    env = os.environ.get("TRTPIPE_TRITONSERVER")
    path = Path(env) if env else TRITON_HOME / "bin" / "tritonserver"
    if not path.is_file():
        raise ServerError(f"tritonserver not found at {path}: run `make setup` (installs nvidia-pytriton==0.7.0 "
                          "with --no-deps into .triton/) or set TRTPIPE_TRITONSERVER")
    return path


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
    n = visible_gpus()
    if n is None or n < cfg.world_size:
        seen = "no GPU (nvidia-smi missing)" if n is None else f"{n} GPU(s)"
        raise ServerError(f"world_size tp x pp = {cfg.world_size} needs {cfg.world_size} GPU(s), this host shows "
                          f"{seen} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}): run on a host "
                          "with enough GPUs, or lower parallelism.tp_size/pp_size and rebuild")


def command(cfg: ServerConfig) -> list[str]:
    """The tritonserver command line for ``cfg``: one process, or under the mpirun launcher the leader-mode
    mpirun (the same function the GPU-host bundle's script uses)."""
    home = tritonserver_binary().parent.parent
    if cfg.launcher == "mpirun":
        return leader_mode_argv(cfg.world_size, str(cfg.model_repository), http_port=cfg.http_port,
                          grpc_port=cfg.grpc_port, metrics_port=cfg.metrics_port, address=cfg.address,
                          tritonserver=str(tritonserver_binary()))
    return [str(tritonserver_binary()),
            f"--model-repository={cfg.model_repository}",
            f"--backend-directory={home / 'backends'}",
            f"--http-address={cfg.address}", f"--http-port={cfg.http_port}",
            f"--grpc-address={cfg.address}", f"--grpc-port={cfg.grpc_port}",
            f"--metrics-address={cfg.address}", f"--metrics-port={cfg.metrics_port}",
            "--allow-metrics=true", "--strict-readiness=true", "--exit-on-error=true",
            "--log-info=true", *cfg.extra_args]


# What tritonserver logs on every start on a host without a GPU (pinned memory, the ensemble's CUDA
# stream, NVML): no cause of a failure there, so neither a relevant line nor a hint for CPU repositories.
NO_GPU_NOISE = ("CUDA driver version is insufficient", "Failed to initialize NVML", "no CUDA-capable device",
                "DCGM unable to start")


def diagnose(log_text: str, gpu: bool | None = None) -> list[str]:
    """Known-failure suggestions for a server log (in table order, each once). ``gpu`` False (a repository
    that serves on the CPU) leaves out the GPU-only ones, whose messages every CPU start logs."""
    low = log_text.lower()
    return [f"{pat!r} in the log -> {fix}" for pat, fix in KNOWN_FAILURES if pat.lower() in low
            and not (gpu is False and pat in NO_GPU_NOISE)]


def _failing_lines(log_text: str, limit: int = 25, gpu: bool | None = None) -> str:
    """The log's error-looking lines, each once (the last ``limit``); on a CPU repository without the
    no-GPU noise."""
    keys = ("error", "failed", "traceback", "exception", "unavailable", "not found", "no module")
    lines = [ln for ln in log_text.splitlines() if any(k in ln.lower() for k in keys)
             and not (gpu is False and any(n.lower() in ln.lower() for n in NO_GPU_NOISE))]
    lines = list(dict.fromkeys(lines))
    return "\n".join(lines[-limit:]) or "\n".join(log_text.splitlines()[-limit:])


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
    off PATH.

    Why: the Python-backend stub embeds the libpython it was linked against and, like any embedded
    CPython, takes its prefix (where the standard library lives) from the first ``python3`` on PATH
    (CPython's getpath: a ``pyvenv.cfg`` beside that executable names its home). With an activated
    virtualenv of another CPython build first on PATH, the stub loads that build's standard library
    and the models fail to load with "undefined symbol" in ``lib-dynload``. Packages reach the stub
    through TRTPIPE_PYTHONPATH, not PATH, so nothing else is lost.
    """
    env = dict(environ)
    keep, dropped = [], []
    for d in env.get("PATH", "").split(os.pathsep):
        (dropped if d and (Path(d).parent / "pyvenv.cfg").is_file() else keep).append(d)
    if dropped:
        log.debug("tritonserver's PATH leaves out virtualenv folders: %s", ", ".join(dropped))
        env["PATH"] = os.pathsep.join(keep)
    return env


class TritonServer:
    """A running tritonserver process (context manager: starts, waits for READY, stops)."""

    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self.log_path = cfg.log_file or (cfg.model_repository.parent / "tritonserver.log")

    def start(self, detach: bool = False) -> "TritonServer":
        cfg = self.cfg
        if not (cfg.model_repository / "ensemble" / "config.pbtxt").is_file():
            raise ServerError(f"{cfg.model_repository} is not a model repository built by trtpipe "
                              "(ensemble/config.pbtxt missing): run `make build-engine` first")
        busy = [p for p in (cfg.http_port, cfg.grpc_port, cfg.metrics_port) if not port_free(p, cfg.address)]
        if busy:
            raise ServerError(f"port(s) {busy} on {cfg.address} already in use: stop the process holding them "
                              "(`trtpipe stop`) or choose other ports (--http-port/--grpc-port/--metrics-port)")
        shm = check_shm()
        if shm:
            log.warning(shm)
        check_gpus(cfg)
        binary = tritonserver_binary()
        ensure_python_stub(binary.parent.parent / "backends")
        env = server_environment(os.environ)
        if cfg.python_path:
            env["TRTPIPE_PYTHONPATH"] = os.pathsep.join(cfg.python_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "w")
        log.info("starting tritonserver: %s", " ".join(command(cfg)))
        self.proc = subprocess.Popen(command(cfg), stdout=logf, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=detach)
        logf.close()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

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

    def stop(self, timeout: float = 40.0) -> dict:
        """Stop the server and every Python-backend stub it started (see :func:`terminate_server`)."""
        if self.proc is None or self.proc.poll() is not None:
            return {"forced": False, "stubs_killed": 0}
        result = terminate_server(self.proc.pid, timeout)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)  # reap
        return result

    def __enter__(self) -> "TritonServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def write_state(path: Path, server: TritonServer) -> None:
    path.write_text(json.dumps({"pid": server.proc.pid, "http": server.cfg.http_url, "grpc": server.cfg.grpc_url,
                                "metrics_port": server.cfg.metrics_port,
                                "model_repository": str(server.cfg.model_repository),
                                "log": str(server.log_path)}, indent=2) + "\n")


def terminate_server(pid: int, timeout: float = 40.0) -> dict:
    """SIGTERM a tritonserver, wait up to ``timeout`` s (it waits up to its own exit timeout, 30 s,
    for in-flight requests), then SIGKILL it; then SIGKILL every Python-backend stub it had started
    that is still alive. Stubs outlive a server that gave up unloading a busy model (e.g. an ensemble
    request still generating) and ignore SIGTERM; each holds a model and its memory.

    Killed stubs cannot release their shared-memory regions: those named on their command lines are
    removed from /dev/shm once server and stubs are gone.

    Returns {"forced": the server had to be killed or left stubs behind, "stubs_killed": count,
    "wait_s": seconds until the server process ended, "shm_removed": region files removed}.
    """
    import psutil

    try:
        server = psutil.Process(pid)
        stubs = server.children(recursive=True)
        regions = {arg: p for p in stubs for arg in _cmdline(p) if arg.startswith("triton_python_backend_shm_region")}
    except psutil.Error:
        return {"forced": False, "stubs_killed": 0, "wait_s": 0.0, "shm_removed": 0}
    forced, t0 = False, time.monotonic()
    with contextlib.suppress(psutil.Error):
        server.terminate()
    try:
        server.wait(timeout)
    except psutil.TimeoutExpired:
        forced = True
        with contextlib.suppress(psutil.Error):
            server.kill()
            server.wait(10)
    except psutil.Error:
        pass
    wait_s = time.monotonic() - t0
    _, alive = psutil.wait_procs(stubs, timeout=5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    removed = 0
    if alive:
        forced = True
        psutil.wait_procs(alive, timeout=5)
        for name, proc in regions.items():
            if proc in alive and not server.is_running():
                with contextlib.suppress(OSError):
                    (Path("/dev/shm") / name).unlink()
                    removed += 1
    return {"forced": forced, "stubs_killed": len(alive), "wait_s": wait_s, "shm_removed": removed}


def _cmdline(proc) -> list[str]:
    import psutil

    try:
        return proc.cmdline()
    except psutil.Error:  # gone, or not ours to read
        return []


def stop_from_state(path: Path, timeout: float = 40.0) -> dict | None:
    """Stop a detached server recorded in ``path`` and its stubs; None if none was running, else
    :func:`terminate_server`'s result."""
    if not path.is_file():
        return None
    pid = json.loads(path.read_text())["pid"]
    result = terminate_server(pid, timeout) if _alive(pid) else None
    path.unlink(missing_ok=True)
    return result


def running_from_state(path: Path) -> dict | None:
    """The recorded detached server if its process is still alive, else None."""
    if not path.is_file():
        return None
    with contextlib.suppress(ValueError, KeyError, OSError):
        state = json.loads(path.read_text())
        if _alive(int(state["pid"])):
            return state
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
