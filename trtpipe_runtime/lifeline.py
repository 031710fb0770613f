"""Ending a process when the process it works for is gone (Linux; standard library only).

Why: a Python-backend stub, the engine worker it starts and the OpenAI frontend each serve one other process
(tritonserver, the stub, tritonserver). After ``kill -9`` of tritonserver they kept running, holding memory and a
third of a core, until ``trtpipe stop``. The stub's own check, ``kill(parent_pid, 0)`` every 300 ms in Triton's
python_backend (src/pb_stub.cc), cannot see a parent that died and was not reaped: a zombie answers that signal.
So each of ours watches for itself:

- :func:`watch_parent`: the parent has died when ``os.getppid()`` changes, which happens when it exits (its
  children are handed to init or a subreaper at once), reaped or not. Used by every model the repository holds
  (their stubs) and by the engine worker (its stub).
- :func:`watch_pid`: for a process that is not our parent (the frontend's tritonserver): gone when
  ``/proc/<pid>/stat`` is absent, says zombie (``Z``) or dead (``X``), or shows another start time (a reused pid).
- :func:`end_stub_with_server`: the engine worker also watches its stub's parent, and kills a stub that outlived
  tritonserver (seen: a stub whose threads were all blocked never ran its own watch).

Not ``prctl(PR_SET_PDEATHSIG)``: its signal comes when the *thread* that forked the process ends (prctl(2)), and
neither the tritonserver thread that forks a stub nor the stub thread that runs ``initialize()`` (which starts the
engine worker) is known to live as long as its process; a system call twice a second costs nothing measurable.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

PERIOD_S = 0.5
"""Seconds between two checks: how long a process may outlive the one it works for, about."""


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks after boot, field 22 of ``/proc/<pid>/stat``), or None when it is
    gone, a zombie, or /proc cannot say."""
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            stat = fh.read()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces and parentheses
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    return int(fields[19])


def _gone(why: str, exit_code: int, on_gone, grace_s: float) -> None:
    print(why, file=sys.stderr, flush=True)  # to the server's log (inherited); not Triton's logger: its pipe is gone
    try:
        if on_gone is not None:
            on_gone()
        if grace_s > 0:  # the process's own shutdown first (uvicorn's on SIGTERM: close connections, exit)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(grace_s)
    finally:
        os._exit(exit_code)


def _watch(is_gone, why: str, on_gone, exit_code: int, period_s: float, grace_s: float,
           name: str) -> threading.Thread:
    def loop():
        while not is_gone():
            time.sleep(period_s)
        _gone(why, exit_code, on_gone, grace_s)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


def watch_parent(what: str, *, parent: int | None = None, on_gone=None, exit_code: int = 1,
                 period_s: float = PERIOD_S, grace_s: float = 0.0) -> threading.Thread:
    """End this process (``os._exit(exit_code)``) once its parent process has exited, checked every ``period_s``
    seconds on a daemon thread: a line naming ``what`` (this process) goes to stderr (the log), ``on_gone()`` runs
    (e.g. to end a child), and with ``grace_s`` > 0 the process is sent SIGTERM and given that many seconds to
    end by itself first.

    Args:
        parent: the pid the parent must have (the one that started this process, passed to it): a parent that
            died before this call is noticed at the first check. Default: ``os.getppid()`` now.

    Returns the watching thread (started).
    """
    expected = os.getppid() if parent is None else int(parent)
    why = f"{what} (pid {os.getpid()}): its parent process {expected} has exited: exiting too"
    return _watch(lambda: os.getppid() != expected, why, on_gone, exit_code, period_s, grace_s,
                  "trtpipe-parent-watch")


def watch_pid(pid: int, what: str, *, on_gone=None, exit_code: int = 1, period_s: float = PERIOD_S,
              grace_s: float = 0.0) -> threading.Thread:
    """As :func:`watch_parent` for a process that need not be this one's parent: ends this process once ``pid``
    has exited (gone, a zombie, or its pid reused: :func:`start_time`). ``what`` names the watched process in the
    log line ("tritonserver").

    Raises:
        ValueError: no live process has pid ``pid`` now (checked here, so a wrong pid fails at start).
    """
    started = start_time(pid)
    if started is None:
        raise ValueError(f"pid {pid}: no such live process (/proc/{pid}/stat): pass the pid of the running {what}")
    why = f"pid {os.getpid()}: the {what} it serves (pid {pid}) has exited: exiting too"
    return _watch(lambda: start_time(pid) != started, why, on_gone, exit_code, period_s, grace_s,
                  "trtpipe-pid-watch")



def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (field 4 of ``/proc/<pid>/stat``), or None when /proc cannot say."""
    try:
        with open(f"/proc/{int(pid)}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def end_stub_with_server(stub: int, what: str, *, period_s: float = PERIOD_S) -> threading.Thread | None:
    """From a process a stub started (the engine worker): once the stub's parent, tritonserver, has exited (gone or a
    zombie: :func:`watch_pid`), SIGKILL the stub, then exit. The stub's own :func:`watch_parent` thread does this
    when it can run; a stub whose threads are all blocked (a Python-backend call into a dead server that holds the
    GIL) never runs it, and would keep itself and this process alive. None when the stub's parent is not known or
    already gone (the stub's own check and :func:`watch_parent` in this process then end them)."""
    server = parent_of(stub)
    if server is None or server <= 1:
        return None
    try:
        return watch_pid(server, f"tritonserver of {what}", period_s=period_s,
                         on_gone=lambda: os.kill(stub, signal.SIGKILL))
    except (ValueError, ProcessLookupError):
        return None


DRAIN_NAME = "trtpipe-drain"
"""The drain file's name in the temporary directory: ``trtpipe-drain-<tritonserver pid>`` (what ``trtpipe stop``
writes), or ``trtpipe-drain`` (any server: a container's preStop hook, where one server runs)."""


STOPPING = ("the server is shutting down (tritonserver is stopping): this request was ended before it finished; send "
            "it again once a server is running")
"""The error of every request a drain ends, and of each new one."""


def draining() -> bool:
    """Whether a drain of this process's parent tritonserver is under way (a drain file exists: :func:`drain`)."""
    return any(f.exists() for f in drain_files(os.getppid()))


def drain_files(server_pid: int) -> tuple[Path, Path]:
    """The files whose presence asks the runtime under tritonserver ``server_pid`` to end its requests in flight:
    (the server's own, the generic one), both in :func:`tempfile.gettempdir`. A drain file stays until the server
    has exited (:func:`drain_done` removes it then); a watching runtime marks itself with ``<drain file>.watch`` and
    answers with ``<drain file>.ack``."""
    tmp = Path(tempfile.gettempdir())
    return tmp / f"{DRAIN_NAME}-{int(server_pid)}", tmp / DRAIN_NAME


def watch_drain(on_drain, *, period_s: float = PERIOD_S) -> threading.Thread:
    """Call ``on_drain()`` once a drain file (:func:`drain_files` of this process's parent, tritonserver) appears,
    then write its ``.ack`` file (what :func:`drain` waits for); checked every ``period_s`` seconds on a daemon
    thread.

    Why: on SIGTERM tritonserver 2.51 refuses new inferences at once, the ensemble's next postprocessing step
    included, then waits up to its exit timeout (30 s) for requests in flight; an ensemble request still streaming
    never ends, and Triton exits anyway and crashes in its exit (SIGSEGV after "Exit timeout expired",
    server/src/main.cc). Nothing tells a Python-backend model (``finalize`` comes after the wait), so whoever
    stops the server asks the runtime first, while the server can still deliver the requests' errors.

    Returns the watching thread (started).
    """
    parent = os.getppid()
    files = drain_files(parent)
    with contextlib.suppress(OSError):  # tells drain() a runtime watches (else it would wait for nothing)
        _suffixed(files[0], ".watch").touch()

    def loop():
        while os.getppid() == parent:
            time.sleep(period_s)
            found = [f for f in files if f.exists()]
            if found:
                on_drain()
                for f in found:
                    with contextlib.suppress(OSError):
                        _suffixed(f, ".ack").touch()
                return

    thread = threading.Thread(target=loop, name="trtpipe-drain-watch", daemon=True)
    thread.start()
    return thread


def drain(server_pid: int, timeout_s: float = 8.0) -> bool:
    """Ask the runtime under tritonserver ``server_pid`` to end every request in flight with :data:`STOPPING` and to
    refuse new ones (:func:`watch_drain`), before the server is sent SIGTERM: writes the drain file and waits up to
    ``timeout_s`` seconds for the runtime's acknowledgement. Call :func:`drain_done` once the server has exited.

    Returns True when the runtime acknowledged; False at once when no runtime of that server watches (its
    ``.watch`` file, written by :func:`watch_drain`, is absent: e.g. the TensorRT-LLM C++ backend), and False when
    it did not answer within ``timeout_s``.
    """
    path = drain_files(server_pid)[0]
    if not _suffixed(path, ".watch").exists():  # no runtime of this server watches
        return False
    try:
        path.touch()
    except OSError:
        return False
    ack = _suffixed(path, ".ack")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ack.exists():
            return True
        time.sleep(0.05)
    return False


def drain_done(server_pid: int) -> None:
    """Remove the drain file of tritonserver ``server_pid``, its acknowledgement and the watch mark (after the server
    exited)."""
    path = drain_files(server_pid)[0]
    for f in (path, _suffixed(path, ".ack"), _suffixed(path, ".watch")):
        f.unlink(missing_ok=True)


def _suffixed(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)
