"""The stage cache: run a stage unless its key matches, and list or clean stage folders.

A stage folder is ``<root>/<build>/<target>/<stage>/`` with a ``stage.json`` naming its key, a
hash of exactly the inputs that decide its output. The folder is written under a temporary name
and renamed when complete (plugins.fsutil.atomic_dir), so a folder that exists is a finished
stage. Temporary folders (``.<stage>.tmp-*``, ``.<stage>.old-*`` holding ``.trtpipe-tmp``) are what a killed
build left behind, or what a running build is writing now: ``trtpipe cache list`` tells them apart by the
build lock (plugins.fsutil.build_lock) and ``trtpipe cache clean`` takes that lock, leaving a folder whose build
is running alone. A folder of that name without the marker is not trtpipe's and is left alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from plugins.fsutil import (TMP_MARKER, BuildBusy, atomic_dir, build_lock, build_lock_holder, is_own_temporary, measure,
                            write_failure, write_json)

log = logging.getLogger("trtpipe.cache")


def stage_key(**parts) -> str:
    """SHA-256 (first 16 hex digits) of the JSON of ``parts`` with sorted keys."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def library_versions() -> dict[str, str]:
    """Versions of the libraries whose behaviour shapes the artifacts."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "nvidia-modelopt", "safetensors", "tritonclient", "tensorrt-llm"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


@dataclass
class StageResult:
    """A finished stage: its folder, key, whether it was reused, and the facts it recorded."""

    name: str
    path: Path
    key: str
    cached: bool
    timing: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def record(self) -> dict:
        """The manifest.json entry."""
        return {"path": str(self.path), "key": self.key, "cached": self.cached, "timing": self.timing,
                "info": self.info}


def run_stage(name: str, out: Path, key: str, produce: Callable[[Path], dict], *, force: bool = False) -> StageResult:
    """Run ``produce(tmp_dir)`` unless ``out/stage.json`` already has ``key``.

    ``produce`` fills the temporary folder and returns a dict of facts for the manifest.

    Raises:
        WriteError: the disk filled up (or is read-only) while the stage wrote; its temporary folder is removed.
        PipelineError: ``out`` is a file or folder trtpipe did not write (plugins.fsutil.atomic_dir).
    """
    marker = out / "stage.json"
    remove_stale_temps(out)
    if not force and marker.is_file():
        prev = json.loads(marker.read_text())
        if prev.get("key") == key:
            log.info("%-10s up to date (key %s), reusing %s", name, key, out)
            return StageResult(name, out, key, True, prev.get("timing", {}), prev.get("info", {}))
    log.info("%-10s running -> %s", name, out)
    try:
        with measure(name) as timing, atomic_dir(out, marker="stage.json") as tmp:
            info = produce(tmp) or {}
            (tmp / "stage.json").write_text(json.dumps({"stage": name, "key": key, "info": info}, default=str))
        record = {"stage": name, "key": key, "timing": timing.as_dict(), "info": info}
        write_json(marker, record)
    except Exception as exc:  # a full or read-only disk is the user's to fix, not a bug: say where and how
        err = write_failure(exc, out, f"the {name} stage",
                            kept="; its partial output was removed and the finished stages are kept")
        if err is None:
            raise
        raise err from exc
    log.info("%-10s done in %.1f s (peak RSS %.0f MiB)", name, timing.wall_s, timing.peak_rss_bytes / 2**20)
    return StageResult(name, out, key, False, timing.as_dict(), info)


def remove_stale_temps(out: Path) -> None:
    """Delete ``.<stage>.tmp-*`` / ``.<stage>.old-*`` siblings left by a build that was killed mid-stage.

    They are never read (a stage folder without ``stage.json`` is never reused either); this only
    frees their space. Builds of one output folder are serialised by fsutil.build_lock, so no running
    build owns them. Only folders trtpipe made (``.trtpipe-tmp`` in them, fsutil.is_own_temporary) are
    deleted; anything else of that name is left as it is.
    """
    if not out.parent.is_dir():
        return
    for stale in list(out.parent.glob(f".{out.name}.tmp-*")) + list(out.parent.glob(f".{out.name}.old-*")):
        if not is_own_temporary(stale, "stage.json"):
            log.warning("%-10s leaving %s as it is: trtpipe did not make it (no %s in it)", out.name, stale,
                        TMP_MARKER)
            continue
        log.info("%-10s removing %s left by an interrupted build", out.name, stale.name)
        shutil.rmtree(stale, ignore_errors=True)


@dataclass(frozen=True)
class CacheEntry:
    """One finished stage folder, or a temporary folder: left by an interrupted build, or being written by a running
    one (``building_pid`` set: the pid that holds the folder's build lock, 0 when it has not recorded it yet)."""

    build: str
    target: str
    stage: str
    key: str | None
    path: Path
    age_days: float
    size_bytes: int
    temporary: bool = False
    building_pid: int | None = None

    @property
    def state(self) -> str:
        """``"building (pid N)"``, ``"(interrupted)"`` for a temporary folder no build holds, else the stage key."""
        if self.temporary and self.building_pid is not None:
            return f"building (pid {self.building_pid or '?'})"
        return self.key or "(interrupted)"


@dataclass
class CleanResult:
    """What :func:`clean` removed (or would remove) and the output folders it left alone because a build held them."""

    removed: list[CacheEntry] = field(default_factory=list)
    busy: list[BuildBusy] = field(default_factory=list)


def _size(path: Path) -> int:
    total = 0
    for f in path.rglob("*"):
        try:  # a running build renames and deletes files under us
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
        except FileNotFoundError:
            continue
    return total


def entries(root: Path) -> list[CacheEntry]:
    """Every stage folder and temporary folder under ``root`` (``<build>/<target>/<stage>``); a temporary folder of
    an output folder whose build lock is held carries the holder's pid (``building_pid``)."""
    out = []
    now = time.time()
    holders: dict[Path, BuildBusy | None] = {}
    for leaf in sorted(p for p in Path(root).glob("*/*/*") if p.is_dir()):
        build, target, stage = leaf.parts[-3:]
        marker = leaf / "stage.json"
        temporary = stage.startswith(".") and (".tmp-" in stage or ".old-" in stage)
        if temporary and not is_own_temporary(leaf, "stage.json"):
            continue  # that name, but not trtpipe's folder: never listed, never cleaned
        if not (marker.is_file() or temporary):
            continue
        try:
            key = json.loads(marker.read_text()).get("key") if marker.is_file() else None
            age = (now - leaf.stat().st_mtime) / 86400
        except FileNotFoundError:
            continue  # a running build renamed it away between the listing and now
        pid = None
        if temporary:
            if leaf.parent not in holders:
                holders[leaf.parent] = build_lock_holder(leaf.parent)
            busy = holders[leaf.parent]
            pid = None if busy is None else (busy.pid or 0)
        out.append(CacheEntry(build, target, stage, key, leaf, age, _size(leaf), temporary, pid))
    return out


@contextlib.contextmanager
def _clean_lock(folder: Path) -> Iterator[None]:
    """``folder``'s build lock, not waiting (raise BuildBusy). A cache that cannot be written (read-only) cannot
    hold the lock file, and no build runs without writing it: there, only a probe for a holder is made."""
    try:
        lock = build_lock(folder, wait=False)
        lock.__enter__()
    except OSError:
        busy = build_lock_holder(folder)
        if busy is not None:
            raise busy from None
        yield
        return
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def clean(root: Path, *, older_than_days: float | None = None, build: str | None = None,
          dry_run: bool = False) -> CleanResult:
    """Delete matching stage folders (and every temporary folder) of the output folders no build is using.

    Each output folder (``<root>/<build>/<target>``) is cleaned holding its build lock (plugins.fsutil.build_lock,
    without waiting): a running build or deploy keeps its folder, temporary folders included, and a build started
    meanwhile waits until the deletion is over. A dry run takes no lock but reports the busy folders too.
    """
    result = CleanResult()
    by_folder: dict[Path, list[CacheEntry]] = {}
    for e in entries(root):
        if build is not None and e.build != build:
            continue
        if not e.temporary and older_than_days is not None and e.age_days < older_than_days:
            continue
        by_folder.setdefault(e.path.parent, []).append(e)
    for folder, matched in by_folder.items():
        if dry_run:
            busy = build_lock_holder(folder)
            if busy is not None:
                result.busy.append(busy)
            else:
                result.removed += matched
            continue
        try:
            with _clean_lock(folder):
                for e in matched:
                    if e.temporary and not is_own_temporary(e.path, "stage.json"):
                        continue  # renamed into place by a build that finished since the listing
                    shutil.rmtree(e.path, ignore_errors=True)
                    result.removed.append(e)
                manifest = folder / "manifest.json"
                if manifest.is_file() and not any((folder / n / "stage.json").is_file()
                                                  for n in ("checkpoint", "engine", "model_repo", "bundle")):
                    manifest.unlink()
        except BuildBusy as busy:
            result.busy.append(busy)
    return result
