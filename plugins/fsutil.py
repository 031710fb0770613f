"""Filesystem helpers: the project root, atomic output folders, the cache root, stage timing and peak memory.

trtpipe keeps what it writes under one documented root, :func:`project_root`: ``$TRTPIPE_HOME``, or the
current directory (a checkout, where ``make`` runs). Below it: ``build/`` (build outputs), ``.cache/``
(converted models, locks; ``$TRTPIPE_CACHE`` moves it) and ``.triton/`` (the tritonserver that
``make setup`` installs; ``$TRTPIPE_TRITON_HOME`` moves it). What ships with the package (target profiles,
Triton templates) is found beside the code, as package data.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil

def project_root() -> Path:
    """Where trtpipe writes: ``$TRTPIPE_HOME``, else the current directory."""
    return Path(os.environ.get("TRTPIPE_HOME") or os.getcwd()).resolve()


def cache_root() -> Path:
    """Cache folder for converted models and locks: ``$TRTPIPE_CACHE`` or ``<project root>/.cache``."""
    return Path(os.environ.get("TRTPIPE_CACHE") or project_root() / ".cache")


@contextlib.contextmanager
def atomic_dir(final: Path, marker: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success replace ``final`` with it, on error delete it.

    A later stage or a server only ever sees ``final`` complete: the rename is atomic on
    one filesystem. Temporary folders are named ``.<name>.tmp-<id>`` so globbing for stage
    outputs never matches them.

    ``marker``: a file (relative path) every folder this writer makes holds (``stage.json`` for a stage). An existing
    non-empty ``final`` without it was not written by trtpipe and is never replaced.

    Raises:
        PipelineError: ``final`` is someone else's folder (before anything is written).
    """
    final = Path(final)
    if marker and final.is_dir() and any(final.iterdir()) and not (final / marker).exists():
        from plugins.errors import PipelineError

        raise PipelineError(f"{final} exists and was not written by trtpipe (no {marker} in it): it is left as it "
                            "is. Fix: move it away, or choose another output root (--out)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock (fcntl) for output ``folder`` for the duration of a build.

    A second build of the same output folder waits here (and says so) instead of racing the
    first one or deleting its temporary folders. The lock file lives in the cache
    (``<cache>/locks/``), so a build that fails its checks leaves nothing in ``folder``; the
    lock dies with the process that held it.
    """
    import fcntl
    import hashlib
    import logging

    locks = cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]
    with open(locks / f"{name}.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            logging.getLogger("trtpipe").info("another build holds %s (pid %s): waiting for it", folder,
                                              fh.read().strip() or "?")
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_json(path: Path, data: object) -> None:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    try:
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # never leave the temporary file where the output should be
        raise


@dataclass
class StageTiming:
    """Wall time (s) and peak resident memory (bytes, this process and its children) of one stage."""

    name: str
    wall_s: float = 0.0
    peak_rss_bytes: int = 0
    start_unix: float = field(default_factory=time.time)

    def as_dict(self) -> dict:
        return {"wall_s": round(self.wall_s, 3), "peak_rss_mib": round(self.peak_rss_bytes / 2**20, 1),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.start_unix))}


class _PeakSampler(threading.Thread):
    def __init__(self, interval: float = 0.05):
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = 0
        self._halt = threading.Event()
        self._proc = psutil.Process()

    def _rss(self) -> int:
        total = self._proc.memory_info().rss
        for child in self._proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
        return total

    def run(self) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self._rss())
            self._halt.wait(self.interval)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        with contextlib.suppress(psutil.Error):
            self.peak = max(self.peak, self._rss())
        return self.peak


@contextlib.contextmanager
def measure(name: str) -> Iterator[StageTiming]:
    """Measure wall time and peak RSS (sampled every 50 ms) of the enclosed block."""
    timing = StageTiming(name)
    sampler = _PeakSampler()
    sampler.start()
    t0 = time.perf_counter()
    try:
        yield timing
    finally:
        timing.wall_s = time.perf_counter() - t0
        timing.peak_rss_bytes = sampler.stop()
