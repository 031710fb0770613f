"""What trtpipe records about the servers it starts, and how they are stopped and cleaned up: the build's
server.json (:func:`write_state`, :func:`running_from_state`, :func:`stop_from_state`), ending a recorded process
tree (:func:`terminate_server`), and reaping the Python-backend stubs and /dev/shm regions a dead server left
(:func:`reap_orphans`, :data:`SHM_PREFIX`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path

from trtpipe_runtime.lifeline import drain, drain_done

log = logging.getLogger("trtpipe")

TRITONSERVER = "tritonserver"
"""The program a server.json without a ``server`` entry recorded (files written before trtllm-serve was served)."""


def write_state(path: Path, server, frontend=None) -> None:
    """Record a started server in ``path`` (the build's server.json): ``server`` (tritonserver or trtllm-serve),
    ``pid``, its addresses, ``log``, and ``openai`` (the frontend's pid, url, log) when one runs beside it.
    ``server`` and ``frontend`` are pipeline.serve's running processes (their ``state()`` and ``proc``)."""
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
        if proc.status() == psutil.STATUS_ZOMBIE:  # it died; its parent has not reaped it (yet)
            return False
        if create_time is not None:
            return abs(proc.create_time() - float(create_time)) < 0.05
        return any(program in arg for arg in proc.cmdline())
    except (psutil.Error, ValueError, TypeError):
        return False


def terminate_server(pid: int, timeout: float = 40.0) -> dict:
    """Ask a tritonserver's runtime to end its requests in flight (trtpipe_runtime.lifeline.drain), SIGTERM it (or trtllm-serve), wait up to ``timeout`` s (tritonserver waits up to its own exit
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
        regions = {arg: p for p in stubs for arg in _cmdline(p) if arg.startswith(SHM_PREFIX)}
    except psutil.Error:
        return {"forced": False, "stubs_killed": 0, "wait_s": 0.0, "shm_removed": 0}
    forced, t0 = False, time.monotonic()
    with contextlib.suppress(psutil.Error):
        if server.name() == TRITONSERVER:  # requests in flight end first (an ensemble stream would outlive SIGTERM)
            drain(pid)
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
    drain_done(pid)
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

    orphans = left_behind(model_repository)
    named = {a for p in orphans for a in _cmdline(p) if a.startswith(SHM_PREFIX)}
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


def left_behind(model_repository: Path) -> list:
    """The live processes (psutil) that run from ``model_repository`` and descend from no live server: what a dead
    tritonserver left (Python-backend stubs, the engine worker)."""
    import psutil

    root = str(Path(model_repository).resolve()) + os.sep
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if (proc.pid != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE
                and any(a.startswith(root) for a in cmd) and not _under_live_server(proc)):
            out.append(proc)
    return out


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
    program = state.get("server", TRITONSERVER)
    front = state.get("openai") or {}
    ours = _recorded_process(pid, state.get("create_time"), program)
    if ours and program == TRITONSERVER:  # requests in flight end with why, through the frontend too
        drain(int(pid))
    if front.get("pid") and _recorded_process(front["pid"], front.get("create_time"), "openai_frontend"):
        terminate_server(int(front["pid"]), 10)  # then the frontend: it holds gRPC streams to the server
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
        result["server"] = state.get("server", TRITONSERVER)
    return result


def running_from_state(path: Path) -> dict | None:
    """The recorded detached server if its process is still alive, else None."""
    if not path.is_file():
        return None
    with contextlib.suppress(ValueError, KeyError, OSError):
        state = json.loads(path.read_text())
        if _recorded_process(state["pid"], state.get("create_time"), state.get("server", TRITONSERVER)):
            return state
    return None


def _alive(pid: int) -> bool:
    """Whether a process has ``pid`` and has not exited (a zombie, dead but not reaped, has)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to inspect: it exists
        return True


def server_status(path: Path) -> dict | None:
    """What the build's server.json ``path`` records and whether it still runs (``trtpipe status``, and ``serve``
    before it starts another): None without a server.json, else the recorded entries with ``running`` (the
    recorded server process is alive: not gone, not a zombie, not a reused pid), ``openai_running`` (the same for
    the frontend; None when none was recorded) and ``left`` (pids still running from its repository though no
    live server owns them: what a crashed server left)."""
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return {"running": False, "unreadable": str(path), "openai_running": None, "left": []}
    state["running"] = _recorded_process(pid, state.get("create_time"), state.get("server", TRITONSERVER))
    front = state.get("openai") or {}
    state["openai_running"] = (_recorded_process(front["pid"], front.get("create_time"), "openai_frontend")
                               if front.get("pid") else None)
    repo = state.get("model_repository")
    state["left"] = [] if state["running"] or not repo else [p.pid for p in left_behind(Path(repo))]
    return state


def request_differences(running: dict, wanted: dict) -> list[str]:
    """What a serve request changes in the running server: one ``"<entry>: running <x>, asked <y>"`` per entry of
    ``wanted`` (server.json's names: server, http, grpc, metrics_port, model_repository, openai (the frontend's URL
    or None), command) whose value differs from ``running`` (server.json's content). Paths compare resolved."""
    def value(state, key):
        v = state.get(key)
        if key == "openai":
            v = (v or {}).get("url") if isinstance(v, dict) else v
        if key == "model_repository" and v:
            v = str(Path(v).resolve())
        return v

    names = {"openai": "OpenAI frontend", "model_repository": "model repository", "metrics_port": "metrics port",
             "http": "HTTP address", "grpc": "gRPC address"}
    return [f"{names.get(k, k)}: running {value(running, k) or 'none'}, asked {value(wanted, k) or 'none'}"
            for k in wanted if value(running, k) != value(wanted, k)]
