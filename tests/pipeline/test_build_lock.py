"""Two builds of one output folder never overlap: the second waits for the first."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from plugins.fsutil import build_lock


def _hold(folder: str, log: str, ready) -> None:
    with build_lock(Path(folder)):
        ready.set()
        time.sleep(0.5)
        with open(log, "a") as fh:
            fh.write("first-done\n")


def test_second_build_waits_for_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "log"
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_hold, args=(str(tmp_path / "out"), str(log), ready))
    p.start()
    assert ready.wait(30)
    with build_lock(tmp_path / "out"):
        with open(log, "a") as fh:
            fh.write("second-in\n")
    p.join(30)
    assert log.read_text().split() == ["first-done", "second-in"]
    assert not (tmp_path / "out").exists()  # the lock lives in the cache, not in the output folder


def _take(folder: str, got) -> None:
    with build_lock(Path(folder)):
        got.set()


def test_other_folders_do_not_wait(tmp_path, monkeypatch):
    """While folder a's lock is held, another process gets folder b's lock. The bound is a hang guard only (a
    lock shared by every folder would block the child forever): the child is killed and the test fails."""
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))
    ctx = mp.get_context("fork")
    got = ctx.Event()
    with build_lock(tmp_path / "a"):
        p = ctx.Process(target=_take, args=(str(tmp_path / "b"), got))
        p.start()
        try:
            obtained = got.wait(60)
        finally:
            if p.is_alive() and not obtained:
                p.kill()
            p.join(30)
        assert obtained, "folder b's lock was not obtained while folder a's was held: one lock for every folder"
        assert p.exitcode == 0
    assert len(list((tmp_path / "cache" / "locks").glob("*.lock"))) == 2  # one lock file per folder
