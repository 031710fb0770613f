"""trtpipe_runtime.lifeline on real processes: a process that watches its parent ends once that parent is killed,
whether the parent is reaped or left a zombie (the case Triton's own stub check, ``kill(parent, 0)``, misses); one
that watches another pid ends once that process has exited, SIGTERM first when given a grace period. Each case
has a control beside it: the same process without the watch still runs when the watching one has ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import REPO
from trtpipe_runtime.lifeline import start_time, watch_pid

DEADLINE_S = 30.0
"""Most seconds a watching process may outlive the one it watches (it checks every 0.5 s)."""

SLEEP = "import time; time.sleep(600)"
WATCH_PARENT = ("import os, time; from trtpipe_runtime.lifeline import watch_parent; "
                "watch_parent('the test child'); os.write(1, b'ready\\n'); time.sleep(600)")  # one write: lines whole
PLAIN = "import os, time; os.write(1, b'ready\\n'); time.sleep(600)"
# starts one child per argument, prints their pids, sleeps
MIDDLE = ("import subprocess, sys, time\n"
          "kids = [subprocess.Popen([sys.executable, '-c', code]) for code in sys.argv[1:]]\n"
          "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
          "time.sleep(600)\n")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_a_watching_child_ends_with_its_killed_parent(reaped):
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE, WATCH_PARENT, PLAIN], stdout=subprocess.PIPE, text=True,
                              env=_env())
    watching = plain = None
    try:
        watching, plain = (int(p) for p in middle.stdout.readline().split())
        assert [middle.stdout.readline().strip() for _ in range(2)] == ["ready", "ready"]  # both started
        os.kill(middle.pid, signal.SIGKILL)
        if reaped:
            middle.wait(10)
        gone, _ = psutil.wait_procs([psutil.Process(watching)], timeout=DEADLINE_S)
        assert gone, f"the watching child outlived its parent by {DEADLINE_S:.0f} s"
        assert _alive(plain), "control: a child without the watch runs on after its parent's death"
        if not reaped:  # the parent really was a zombie all along: kill(pid, 0) would still find it
            assert psutil.Process(middle.pid).status() == psutil.STATUS_ZOMBIE
    finally:
        _kill(*(p for p in (watching, plain) if p))
        middle.kill()
        middle.wait(10)


def test_a_process_watching_a_pid_ends_once_it_has_exited_sigterm_first():
    sleeper = subprocess.Popen([sys.executable, "-c", SLEEP])
    code = ("import signal, sys, time\n"
            "from trtpipe_runtime.lifeline import watch_pid\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('sigterm', flush=True), sys.exit(0)))\n"
            f"watch_pid({sleeper.pid}, 'sleeper', grace_s=20)\n"
            "print('ready', flush=True)\n"
            "while True: time.sleep(0.05)\n")
    watcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=_env())
    control = subprocess.Popen([sys.executable, "-c", SLEEP])
    try:
        assert watcher.stdout.readline().strip() == "ready"
        sleeper.kill()  # left a zombie: not reaped until the end
        out, err = watcher.communicate(timeout=DEADLINE_S)
        assert out.strip() == "sigterm" and watcher.returncode == 0  # its own shutdown ran, not the os._exit
        assert f"the sleeper it serves (pid {sleeper.pid}) has exited" in err
        assert control.poll() is None
    finally:
        for p in (watcher, control, sleeper):
            p.kill()
            p.wait(10)


def test_start_time_sees_a_zombie_as_gone_and_watch_pid_refuses_a_dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", SLEEP])
    try:
        assert start_time(proc.pid) is not None and start_time(os.getpid()) is not None
        proc.kill()  # a zombie from here on: not reaped until the end
        deadline = time.monotonic() + DEADLINE_S
        while start_time(proc.pid) is not None and time.monotonic() < deadline:  # the kill lands asynchronously
            time.sleep(0.05)
        assert psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
        assert start_time(proc.pid) is None
        with pytest.raises(ValueError, match=rf"pid {proc.pid}: no such live process"):
            watch_pid(proc.pid, "tritonserver")
    finally:
        proc.wait(10)


# watches for a drain of its parent (this test process): on it, says so and waits half a second (the runtime ends its
# requests here) before the acknowledgement
WATCH_DRAIN = ("import os, sys, time; from trtpipe_runtime.lifeline import draining, watch_drain\n"
               "watch_drain(lambda: (os.write(1, b'drained %d\\n' % draining()), time.sleep(0.5)), period_s=0.05)\n"
               "os.write(1, b'ready\\n'); time.sleep(600)\n")


def test_a_drain_is_seen_by_the_runtime_and_acknowledged_only_after_it_ran(tmp_path, monkeypatch):
    from trtpipe_runtime import lifeline

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the drain files of this test only
    monkeypatch.setattr(lifeline.tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    child = subprocess.Popen([sys.executable, "-c", WATCH_DRAIN], stdout=subprocess.PIPE, text=True,
                             env={**_env(), "TMPDIR": str(tmp_path)})
    try:
        assert child.stdout.readline().strip() == "ready"
        mine = lifeline.drain_files(os.getpid())[0]
        assert mine.parent == tmp_path and not mine.exists()
        t0 = time.monotonic()
        assert lifeline.drain(os.getpid(), timeout_s=DEADLINE_S) is True
        assert time.monotonic() - t0 >= 0.5  # not before on_drain returned
        assert child.stdout.readline().strip() == "drained 1"  # it ran while the drain file was there
        assert mine.exists()  # kept until the server has exited: the BLS asks draining() meanwhile
        lifeline.drain_done(os.getpid())
        assert not list(tmp_path.iterdir())
    finally:
        _kill(child.pid)
        child.wait()


def test_a_drain_nobody_watches_returns_at_once_and_one_unanswered_waits_no_longer_than_asked(tmp_path, monkeypatch):
    from trtpipe_runtime import lifeline

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(lifeline.tempfile, "tempdir", None)
    t0 = time.monotonic()
    assert lifeline.drain(os.getpid(), timeout_s=DEADLINE_S) is False  # no runtime marked itself: no wait at all
    assert time.monotonic() - t0 < DEADLINE_S / 2
    (tmp_path / f"{lifeline.DRAIN_NAME}-{os.getpid()}.watch").touch()  # a watcher that died without answering
    assert lifeline.drain(os.getpid(), timeout_s=0.2) is False
    lifeline.drain_done(os.getpid())
    assert not list(tmp_path.iterdir())


WORKER = ("import os, time; from trtpipe_runtime.lifeline import end_stub_with_server; "
          "assert end_stub_with_server(os.getppid(), 'the test stub') is not None; time.sleep(600)")
# a stub that never runs a watch of its own (as one whose threads are all blocked), with an engine worker
WEDGED_STUB = ("import os, subprocess, sys, time\n"
               f"w = subprocess.Popen([sys.executable, '-c', {WORKER!r}])\n"
               "time.sleep(2)\n"
               "os.write(1, f'ready {w.pid}\\n'.encode())\n"
               "time.sleep(600)\n")


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_the_engine_worker_ends_a_wedged_stub_once_tritonserver_is_gone(reaped):
    """The stub (a child of the 'server') runs no watch; its worker's end_stub_with_server kills it, and itself, once
    the server is killed; a stub of the same server without such a worker runs on (control)."""
    server = subprocess.Popen([sys.executable, "-c", MIDDLE, WEDGED_STUB, PLAIN], stdout=subprocess.PIPE, text=True,
                              env=_env())
    stub = plain = worker = None
    try:
        stub, plain = (int(p) for p in server.stdout.readline().split())
        lines = [server.stdout.readline().strip() for _ in range(2)]
        worker = int(next(line for line in lines if line.startswith("ready ")).split()[1])
        assert _alive(worker) and _alive(stub)
        os.kill(server.pid, signal.SIGKILL)
        if reaped:
            server.wait(10)
        gone, _ = psutil.wait_procs([psutil.Process(stub), psutil.Process(worker)], timeout=DEADLINE_S)
        assert len(gone) == 2, f"the stub or its worker outlived the server by {DEADLINE_S:.0f} s"
        assert _alive(plain), "control: a stub without such a worker runs on after the server's death"
    finally:
        _kill(*(p for p in (stub, plain, worker) if p))
        server.kill()
        server.wait(10)
