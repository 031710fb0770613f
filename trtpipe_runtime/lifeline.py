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

Not ``prctl(PR_SET_PDEATHSIG)``: its signal comes when the *thread* that forked the process ends (prctl(2)), and
neither the tritonserver thread that forks a stub nor the stub thread that runs ``initialize()`` (which starts the
engine worker) is known to live as long as its process; a system call twice a second costs nothing measurable.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

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
