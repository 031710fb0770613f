"""Launch tritonserver on a model repository and wait until every model is READY; or, for a trtllm-llmapi build,
TensorRT-LLM's ``trtllm-serve`` and wait until ``/health`` answers 200.

The server binary comes from the ``nvidia-pytriton`` wheel, installed by ``make setup`` into
``.triton/`` (or ``$TRTPIPE_TRITONSERVER``). Before starting: the ports must be free, the
Python-backend stub matching this interpreter is put in place, and the repository exists.
The server listens on 127.0.0.1 unless told otherwise. Failures are reported with the
failing model's log lines and, where a known pattern matches, the fix.

``trtllm-serve`` (:class:`TrtllmServe`) is whatever ``shutil.which("trtllm-serve")`` finds; it runs the command
of ``model_repo.deploy.trtllm_serve_argv`` (the deployment files' command) with this host's address and port.
Where it is absent, :func:`trtllm_serve_config` still checks the build, so the caller can print the command
for a GPU host. Both servers record themselves in the build's ``server.json`` (:func:`write_state`), which
:func:`stop_from_state` reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
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
from plugins.procenv import passive_openmp
from plugins.runtimes import leader_mode_argv

log = logging.getLogger("trtpipe")

TRITON_HOME = Path(os.environ.get("TRTPIPE_TRITON_HOME") or project_root() / ".triton" / "pytriton" / "tritonserver")

# Log patterns -> what to do about them.
KNOWN_FAILURES: tuple[tuple[str, str], ...] = (
    ("address already in use", "another process holds the port: stop it (`trtpipe stop`) or pass --http-port/"
                               "--grpc-port/--metrics-port"),
    ("needs TensorRT-LLM", "this repository is for a GPU host with TensorRT-LLM (runtime trtllm-llmapi): serve it "
                           "there as its deploy/README.md says; here, build with --runtime pytorch"),
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


# trtllm-serve's log patterns -> what to do about them; each is the message of the component named in the fix
# (uvicorn's bind error, torch/CUDA's runtime errors, Python's import error, click's usage error, pydantic's
# extra='forbid' error of TorchLlmArgs: tests/facts/trtllm_1_2_1/llm_args.json torch_refuses_extra_how).
TRTLLM_SERVE_FAILURES: tuple[tuple[str, str], ...] = (
    ("address already in use", "another process holds the HTTP port (uvicorn could not bind it): stop it "
                               "(`trtpipe stop`) or pass --http-port"),
    ("out of memory", "the checkpoint or its KV cache does not fit the GPU memory (CUDA out of memory): lower "
                      "serving.kv_cache_free_gpu_mem_fraction or limits.max_batch_size/max_num_tokens, or raise "
                      "parallelism.tp_size, and rebuild"),
    ("no CUDA-capable device", "no GPU visible to trtllm-serve: check CUDA_VISIBLE_DEVICES and the container's "
                               "--gpus / nvidia.com/gpu request"),
    ("CUDA driver version is insufficient", "the host driver is older than this TensorRT-LLM's CUDA: use the "
                                            "container release that matches the driver (NVIDIA's support matrix)"),
    ("No module named", "the Python that runs trtllm-serve cannot import a package: run it in the image that "
                        "deploy/README.md names, or reinstall tensorrt_llm"),
    ("No such option", "this trtllm-serve does not take an option of the command (click's usage error): check its "
                       "version, 1.2.1 or later (`python3 -c 'import tensorrt_llm; print(tensorrt_llm.__version__)'`)"),
    ("Extra inputs are not permitted", "the options file has a key this TensorRT-LLM's LLM API refuses "
                                       "(TorchLlmArgs forbids unknown keys): check the version (1.2.1 or later), or "
                                       "take the key out of serving.llm_api_options and rebuild"),
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
    """The tritonserver command line for ``cfg``: one process, or under the mpirun launcher the leader-mode
    mpirun (the same function the GPU-host bundle's script uses). ``--disable-auto-complete-config``, as
    TensorRT-LLM's ``scripts/launch_triton_server.py`` passes: the generated configs are complete, and with
    auto-complete on the Python backend starts a stub per model only to ask it (python_be.cc,
    ``LaunchAutoCompleteStubProcess``; 8 s of a 17 s start on 2 cores)."""
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
            "--disable-auto-complete-config", "--log-info=true", *cfg.extra_args]


# What tritonserver logs on every start on a host without a GPU (pinned memory, the ensemble's CUDA
# stream, NVML): no cause of a failure there, so neither a relevant line nor a hint for CPU repositories.
NO_GPU_NOISE = ("CUDA driver version is insufficient", "Failed to initialize NVML", "no CUDA-capable device",
                "DCGM unable to start")


def diagnose(log_text: str, gpu: bool | None = None,
             failures: tuple[tuple[str, str], ...] = KNOWN_FAILURES) -> list[str]:
    """Known-failure suggestions for a server log (in table order, each once). ``gpu`` False (a repository
    that serves on the CPU) leaves out the GPU-only ones, whose messages every CPU start logs. ``failures``:
    the table (:data:`KNOWN_FAILURES` for tritonserver, :data:`TRTLLM_SERVE_FAILURES` for trtllm-serve)."""
    low = log_text.lower()
    return [f"{pat!r} in the log -> {fix}" for pat, fix in failures if pat.lower() in low
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

    def _launch(self, argv: list[str], env: dict, detach: bool):
        """Spawn ``argv`` and wait until the server is ready (:meth:`wait_ready`); stop it on any failure."""
        self._spawn(argv, env, detach)
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
            log.info("starting %s: %s", self.program, shlex.join(argv))
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

    program = "tritonserver"

    def __init__(self, cfg: ServerConfig):
        super().__init__(cfg.log_file or (cfg.model_repository.parent / "tritonserver.log"))
        self.cfg = cfg

    def start(self, detach: bool = False) -> "TritonServer":
        cfg = self.cfg
        if not (cfg.model_repository / "ensemble" / "config.pbtxt").is_file():
            raise ServerError(f"{cfg.model_repository} is not a model repository built by trtpipe "
                              "(ensemble/config.pbtxt missing): run `trtpipe build` first")
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
        return self._launch(command(cfg), env, detach)

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


TRTLLM_SERVE = "trtllm-serve"
"""The executable :class:`TrtllmServe` looks for on PATH."""


@dataclass
class TrtllmServeConfig:
    """How to launch trtllm-serve on one trtllm-llmapi build (made and checked by :func:`trtllm_serve_config`)."""

    argv: list[str]
    """``model_repo.deploy.trtllm_serve_argv`` with this host's paths, address and port (``argv[0]``: trtllm-serve)."""
    checkpoint: Path
    """The unified HF checkpoint folder (the build's ``engine/``)."""
    options_file: Path
    """The LLM-API options YAML (``--config``)."""
    address: str = "127.0.0.1"
    http_port: int = 8000
    log_file: Path | None = None
    ready_timeout_s: float = 600.0
    """Seconds to wait for ``/health`` to answer 200."""
    world_size: int = 1
    """GPUs it needs: the options' tensor_parallel_size x pipeline_parallel_size."""
    image: str = ""
    """The container image that ships the pinned TensorRT-LLM (``model_repo.deploy.runtime_image``)."""

    @property
    def health_url(self) -> str:
        """``GET`` here answers 200 once the model is loaded (model_repo.deploy.TRTLLM_SERVE_HEALTH)."""
        from model_repo.deploy import TRTLLM_SERVE_HEALTH

        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.address, self.address)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.http_port}{TRTLLM_SERVE_HEALTH}"


def installed_tensorrt_llm() -> str | None:
    """The installed TensorRT-LLM's version (package metadata; nothing is imported), or None."""
    from importlib import metadata

    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _major_minor(version: str) -> tuple[int, int]:
    import re

    parts = [int(x) for x in re.findall(r"\d+", version)[:2]]
    return tuple(parts + [0] * (2 - len(parts)))  # type: ignore[return-value]


def trtllm_serve_config(build, folder: Path, *, address: str = "127.0.0.1", http_port: int | None = None,
                        ready_timeout_s: float = 600.0, model_repo: Path | None = None) -> TrtllmServeConfig:
    """The trtllm-serve launch of ``build`` from its build folder, after checking what can be checked without
    TensorRT-LLM: the runtime, the checkpoint's config.json, the options file (YAML mapping, every key one that
    TensorRT-LLM 1.2.1 and 1.4 accept: builders.llmapi_options.option_problems).

    Args:
        folder: the build folder (``build/<name>/<target>``).
        http_port: default ``serving.http_port``.
        model_repo: read the options from this repository's ``tensorrt_llm/1/llm_api_options.yaml`` instead of the
            build's (an edited copy).

    Raises:
        ServerError: the runtime is not trtllm-llmapi; the checkpoint or the options file is missing or unreadable.
        SpecError: the options file has a key a supported TensorRT-LLM release refuses.
    """
    from builders.llmapi_options import RELEASES, option_problems
    from builders.llmapi_options import options_file as options_file_for
    from model_repo.deploy import TRTLLM_SERVE_OPTIONS_FILE, runtime_image, trtllm_serve_argv
    from plugins.errors import SpecError

    spec = f"trtpipe build {build.spec_path} --target {build.target}"
    if build.runtime.engine != "llmapi":
        raise ServerError(f"runtime {build.settings.runtime!r} of build {build.name} for {build.target}: --server "
                          "trtllm-serve serves trtllm-llmapi builds only (TensorRT-LLM's LLM API on the unified HF "
                          "checkpoint); serve it with --server triton, or build it with `" + spec + " --runtime "
                          "trtllm-llmapi` and serve that with --runtime trtllm-llmapi --server trtllm-serve")
    folder = Path(folder).resolve()
    checkpoint = folder / "engine"
    config_json = checkpoint / "config.json"
    try:
        if not isinstance(json.loads(config_json.read_text()), dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise ServerError(f"{config_json}: no readable checkpoint config ({exc}); trtllm-serve loads the unified HF "
                          f"checkpoint from {checkpoint}: run `{spec}` first") from exc
    options_file = ((Path(model_repo).resolve() / TRTLLM_SERVE_OPTIONS_FILE.split("/", 1)[1]) if model_repo
                    else folder / TRTLLM_SERVE_OPTIONS_FILE)
    installed = installed_tensorrt_llm()
    if installed:  # a later release's own file where the build wrote one (speculative_config's spelling)
        for release in reversed(RELEASES[1:]):
            later = options_file.parent / options_file_for(release)
            if later.is_file() and _major_minor(installed) >= _major_minor(release):
                options_file = later
                break
    import yaml

    try:
        options = yaml.safe_load(options_file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ServerError(f"{options_file}: the LLM-API options file is missing or not YAML ({exc}): "
                          + ("pass a repository with tensorrt_llm/1/llm_api_options.yaml as --model-repo" if model_repo
                             else f"run `{spec}` (the model_repo stage writes it)")) from exc
    if not isinstance(options, dict):
        raise ServerError(f"{options_file}: holds a {type(options).__name__}, trtllm-serve's --config needs a mapping "
                          "of LLM-API options: regenerate it with `" + spec + "`")
    # the file serves every release unless a later one has its own (builders.llmapi_options.options_files)
    releases = ([r for r in RELEASES if r == RELEASES[0] or not (options_file.parent / options_file_for(r)).is_file()]
                if options_file.name == options_file_for(RELEASES[0]) else
                [r for r in RELEASES if options_file_for(r) == options_file.name])
    problems = option_problems(options, field="llm_api_options", releases=releases)
    if problems:
        raise SpecError(problems, str(options_file), what="the LLM-API options file")
    port = http_port or build.settings.serving.http_port
    argv = trtllm_serve_argv(build, str(folder), host=address, port=port, config=str(options_file))
    world = int(options.get("tensor_parallel_size") or 1) * int(options.get("pipeline_parallel_size") or 1)
    log_dir = Path(model_repo).resolve().parent if model_repo else folder  # beside the repository, as tritonserver's
    return TrtllmServeConfig(argv, checkpoint, options_file, address, port, log_dir / f"{TRTLLM_SERVE}.log",
                             ready_timeout_s, world, runtime_image(build.runtime))


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
            raise ServerError(f"{TRTLLM_SERVE} is not on PATH: install TensorRT-LLM 1.2.1 or later, or run "
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


@dataclass
class FrontendLaunch:
    """How to start the OpenAI-compatible frontend (pipeline.openai_frontend) beside a tritonserver."""

    grpc_url: str
    model: str
    tokenizer_dir: Path
    max_input_len: int
    max_seq_len: int
    add_special_tokens: bool
    address: str = "127.0.0.1"
    port: int = 9000
    log_file: Path | None = None
    ready_timeout_s: float = 120.0
    triton_model: str = "tensorrt_llm_bls"
    """The Triton model it sends to (pipeline.openai_frontend.FrontendConfig.triton_model)."""
    trust_remote_code: bool = False
    """Whether the tokenizer's own code may run (the repository's preprocessing ``trust_remote_code``)."""

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def argv(self) -> list[str]:
        from model_repo.deploy import frontend_argv

        return frontend_argv(sys.executable, grpc_url=self.grpc_url, model=self.model, tokenizer=str(self.tokenizer_dir),
                             max_input_len=self.max_input_len, max_seq_len=self.max_seq_len,
                             add_special_tokens=self.add_special_tokens, host=self.address, port=self.port,
                             triton_model=self.triton_model, trust_remote_code=self.trust_remote_code)


def frontend_launch(build, cfg: ServerConfig, port: int, tokenizer_dir: Path) -> FrontendLaunch:
    """The frontend for ``build`` served by ``cfg``: its model id is the build name, its limits the build's,
    prompt tokens counted as the repository's preprocessing model counts them (``add_special_tokens``)."""
    from model_repo.deploy import preprocessing_adds_special_tokens, preprocessing_trusts_remote_code

    special = preprocessing_adds_special_tokens(cfg.model_repository)
    lim = build.settings.limits
    return FrontendLaunch(cfg.grpc_url, build.name, tokenizer_dir, lim.max_input_len, lim.max_seq_len, special,
                          cfg.address, port, cfg.model_repository.parent / "openai_frontend.log",
                          trust_remote_code=preprocessing_trusts_remote_code(cfg.model_repository))


class OpenAIFrontend(_ServerProcess):
    """The OpenAI-compatible frontend process (uvicorn), ready when its ``/health`` answers 200 (Triton ready)."""

    program = "openai-frontend"

    def __init__(self, launch: FrontendLaunch):
        super().__init__(launch.log_file or Path("openai_frontend.log"))
        self.launch = launch

    def start(self, detach: bool = False) -> "OpenAIFrontend":
        """Start it and wait for ``/health``.

        Raises:
            ServerError: the port is taken, or it exited or did not answer in time (then it is stopped).
        """
        if not port_free(self.launch.port, self.launch.address):
            raise ServerError(f"port {self.launch.port} on {self.launch.address} already in use (the OpenAI "
                              "frontend's): stop the process holding it, or pass --openai-port, or --no-openai")
        return self._launch(self.launch.argv(), dict(os.environ), detach)

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


def write_state(path: Path, server: TritonServer | TrtllmServe, frontend: OpenAIFrontend | None = None) -> None:
    """Record a started server in ``path`` (the build's server.json): ``server`` (tritonserver or trtllm-serve),
    ``pid``, its addresses, ``log``, and ``openai`` (the frontend's pid, url, log) when one runs beside it."""
    state = server.state()
    state["create_time"] = _create_time(state["pid"])
    if frontend is not None:
        state["openai"] = {**frontend.state(), "create_time": _create_time(frontend.proc.pid)}
    path.write_text(json.dumps(state, indent=2) + "\n")


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _recorded_process(pid: int, create_time: float | None, program: str) -> bool:
    """Whether ``pid`` is still the process server.json recorded: same start time (psutil ``create_time``), or,
    in a file without one, a command line naming ``program``. A reused pid, or a server.json copied from elsewhere,
    must never make ``stop`` end an unrelated process."""
    import psutil

    try:
        proc = psutil.Process(int(pid))
        if create_time is not None:
            return abs(proc.create_time() - float(create_time)) < 0.05
        return any(program in arg for arg in proc.cmdline())
    except (psutil.Error, ValueError, TypeError):
        return False


def terminate_server(pid: int, timeout: float = 40.0) -> dict:
    """SIGTERM a tritonserver (or trtllm-serve), wait up to ``timeout`` s (tritonserver waits up to its own exit
    timeout, 30 s, for in-flight requests), then SIGKILL it; then SIGKILL every process it had started that is
    still alive (tritonserver's Python-backend stubs; trtllm-serve's worker processes). Stubs outlive a server that
    gave up unloading a busy model (e.g. an ensemble request still generating) and ignore SIGTERM; each holds a
    model and its memory.

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


SHM_PREFIX = "triton_python_backend_shm_region"
"""Name prefix of the shared-memory regions Triton's Python backend creates in /dev/shm, one per stub."""


def _mapped_shm() -> set[str]:
    """/dev/shm file names some live process has mapped (read from /proc/<pid>/maps)."""
    names: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            for line in maps.read_text().splitlines():
                if "/dev/shm/" in line:
                    names.add(line.rsplit("/dev/shm/", 1)[1].split(" ")[0])
    return names


def reap_orphans(model_repository: Path, since: float | None = None) -> dict:
    """After a tritonserver died (or was killed): SIGKILL the processes it left that run from
    ``model_repository`` (Python-backend stubs and the engine worker outlive a killed server and ignore
    SIGTERM), then remove the Python backend's /dev/shm regions that they named or that no live process maps
    and that were made at or after ``since`` (the server's start, seconds since the epoch; None: only the
    named ones). Processes of another live server on the same repository (descendants of a
    :data:`SERVER_PROGRAMS` process) are left alone.

    Returns {"orphans_killed": count, "shm_removed": count}.
    """
    import psutil

    root = str(Path(model_repository).resolve()) + os.sep
    orphans, named = [], set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        if proc.pid != os.getpid() and any(a.startswith(root) for a in cmd) and not _under_live_server(proc):
            orphans.append(proc)
            named.update(a for a in cmd if a.startswith(SHM_PREFIX))
    for proc in orphans:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(orphans, timeout=5)
    mapped = _mapped_shm()
    removed = 0
    for f in Path("/dev/shm").glob(SHM_PREFIX + "*"):
        with contextlib.suppress(OSError):
            if f.name in mapped:
                continue
            if f.name in named or (since is not None and f.stat().st_ctime >= since - 1.0):
                f.unlink()
                removed += 1
    return {"orphans_killed": len(orphans), "shm_removed": removed}


SERVER_PROGRAMS = frozenset({"tritonserver", "mpirun", "trtllm-serve"})
"""Process names (``/proc/PID/comm``) of the servers whose descendants :func:`reap_orphans` leaves alone."""


def _under_live_server(proc) -> bool:
    """Whether ``proc`` is a live server program or descends from one (then it is no orphan: another server on the
    same repository still runs it)."""
    import psutil

    try:
        for p in [proc, *proc.parents()]:
            if p.name() in SERVER_PROGRAMS and p.status() != psutil.STATUS_ZOMBIE:
                return True
    except psutil.Error:  # gone meanwhile: nothing to reap
        return True
    return False


def _merge_reaped(result: dict, reaped: dict) -> dict:
    """terminate_server's result with reap_orphans' counts added."""
    result["orphans_killed"] = reaped.get("orphans_killed", 0)
    result["shm_removed"] = result.get("shm_removed", 0) + reaped.get("shm_removed", 0)
    return result


def _cmdline(proc) -> list[str]:
    import psutil

    try:
        return proc.cmdline()
    except psutil.Error:  # gone, or not ours to read
        return []


def stop_from_state(path: Path, timeout: float = 40.0) -> dict | None:
    """Stop a detached server recorded in ``path`` (tritonserver or trtllm-serve) and the processes it started;
    None if none was running, else :func:`terminate_server`'s result with ``server``, the program's name."""
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    pid = state["pid"]
    program = state.get("server", TritonServer.program)
    front = state.get("openai") or {}
    if front.get("pid") and _recorded_process(front["pid"], front.get("create_time"), "openai_frontend"):
        terminate_server(int(front["pid"]), 10)  # first: it holds gRPC streams to the server
    ours = _recorded_process(pid, state.get("create_time"), program)
    if not ours and _alive(int(pid)):
        log.warning("%s names pid %s, which is not the %s it recorded (another process now): left alone",
                    path, pid, program)
    result = terminate_server(pid, timeout) if ours else None
    repo = state.get("model_repository")
    if repo and (ours or not _alive(int(pid))):  # also after a crash: its stubs and worker may still run
        reaped = reap_orphans(Path(repo), state.get("create_time"))
        if result is None and any(reaped.values()):
            log.warning("the recorded %s (pid %s) was gone; removed what it left: %d processes, %d /dev/shm "
                        "regions", program, pid, reaped["orphans_killed"], reaped["shm_removed"])
            result = {"forced": False, "stubs_killed": 0, "crashed": True}
        if result is not None:
            result = _merge_reaped(result, reaped)
    path.unlink(missing_ok=True)
    if result is not None:
        result["server"] = state.get("server", TritonServer.program)
    return result


def running_from_state(path: Path) -> dict | None:
    """The recorded detached server if its process is still alive, else None."""
    if not path.is_file():
        return None
    with contextlib.suppress(ValueError, KeyError, OSError):
        state = json.loads(path.read_text())
        if _recorded_process(state["pid"], state.get("create_time"), state.get("server", TritonServer.program)):
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
