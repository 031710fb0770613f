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


def _building(leaf: str, started, finish) -> None:
    """A build of output folder ``leaf`` (its lock held as pipeline.build holds it) stopped mid-stage."""
    from pipeline.cache import run_stage

    def produce(tmp: Path) -> dict:
        (tmp / "rank0.safetensors").write_bytes(b"x" * 4096)
        started.set()
        finish.wait(60)
        return {}

    with build_lock(Path(leaf)):
        run_stage("engine", Path(leaf) / "engine", "k1", produce)


def test_cache_list_and_clean_leave_a_running_build_alone(tmp_path, monkeypatch, capsys):
    """While a build writes ``.engine.tmp-*`` in its output folder, ``trtpipe cache list`` shows that folder as
    building with the build's pid (an interrupted build's folder elsewhere as interrupted), and ``trtpipe cache
    clean`` leaves it alone, naming the folder and the pid, while it removes the interrupted one; the build then
    completes its stage."""
    from pipeline.cli import main
    from plugins.fsutil import TMP_MARKER

    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "build"
    live, dead = root / "tiny" / "cpu", root / "tiny" / "gpu"
    left = dead / ".engine.tmp-dead"  # what a killed build leaves: the marker, no lock held
    left.mkdir(parents=True)
    (left / TMP_MARKER).write_text("")
    ctx = mp.get_context("fork")
    started, finish = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_building, args=(str(live), started, finish))
    p.start()
    try:
        assert started.wait(60)
        (tmp,) = live.glob(".engine.tmp-*")
        assert main(["cache", "list", "--out", str(root)]) == 0
        rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("tiny ")}
        assert f"building (pid {p.pid})" in rows["cpu"], rows
        assert "(interrupted)" in rows["gpu"] and "building" not in rows["gpu"], rows

        assert main(["cache", "clean", "--out", str(root)]) == 0
        out = capsys.readouterr().out
        assert tmp.is_dir() and (tmp / "rank0.safetensors").is_file(), "cache clean deleted a running build's folder"
        assert f"left {live} as it is: a running build (pid {p.pid})" in out, out
        assert not left.exists() and f"removed {left}" in out, out
    finally:
        finish.set()
        p.join(60)
    assert p.exitcode == 0
    assert (live / "engine" / "stage.json").is_file() and not list(live.glob(".engine.tmp-*"))
    assert main(["cache", "clean", "--out", str(root)]) == 0  # the build over, its folder is cleaned
    assert not (live / "engine").exists()


def test_cache_clean_works_where_no_lock_file_can_be_written(tmp_path, monkeypatch, capsys):
    """A cache that cannot hold lock files (here a file stands where it would be) holds no build's lock either:
    ``trtpipe cache clean`` still cleans, instead of failing on the lock."""
    from pipeline.cli import main
    from plugins.fsutil import TMP_MARKER

    (tmp_path / "not-a-folder").write_text("")
    monkeypatch.setenv("TRTPIPE_CACHE", str(tmp_path / "not-a-folder" / "cache"))
    left = tmp_path / "build" / "tiny" / "cpu" / ".engine.tmp-dead"
    left.mkdir(parents=True)
    (left / TMP_MARKER).write_text("")
    assert main(["cache", "clean", "--out", str(tmp_path / "build")]) == 0
    assert not left.exists() and f"removed {left}" in capsys.readouterr().out
