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


def test_other_folders_do_not_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))
    with build_lock(tmp_path / "a"):
        with build_lock(tmp_path / "b"):
            pass
