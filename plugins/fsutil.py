"""Filesystem helpers: the project root, atomic output folders, the cache root, stage timing and peak memory.

trtpipe keeps what it writes under one documented root, :func:`project_root`: ``$TRTPIPE_HOME``, or the
current directory (a checkout, where ``make`` runs). Below it: ``build/`` (build outputs), ``.cache/``
(converted models, locks; ``$TRTPIPE_CACHE`` moves it) and ``.triton/`` (the tritonserver that
``make setup`` installs; ``$TRTPIPE_TRITON_HOME`` moves it). What ships with the package (target profiles,
Triton templates) is found beside the code, as package data.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import psutil

if TYPE_CHECKING:
    from plugins.errors import WriteError


def project_root() -> Path:
    """Where trtpipe writes: ``$TRTPIPE_HOME``, else the current directory."""
    return Path(os.environ.get("TRTPIPE_HOME") or os.getcwd()).resolve()


def cache_root() -> Path:
    """Cache folder for converted models and locks: ``$TRTPIPE_CACHE`` or ``<project root>/.cache``."""
    return Path(os.environ.get("TRTPIPE_CACHE") or project_root() / ".cache")


TMP_MARKER = ".trtpipe-tmp"
"""The file in every temporary folder :func:`atomic_dir` makes: only a ``.<name>.tmp-*`` or ``.<name>.old-*`` folder that
holds it is trtpipe's to delete (pipeline.cache.remove_stale_temps, ``trtpipe cache clean``); it is removed before the
folder is renamed into place, so finished folders do not carry it."""


def is_own_temporary(path: Path, marker: str | None = None) -> bool:
    """Whether ``path`` is a temporary folder trtpipe made: a folder (not a link) with :data:`TMP_MARKER` in it, or,
    for a ``.<name>.old-*`` folder, the ``marker`` of the folder it replaced (``stage.json``)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return False
    if (path / TMP_MARKER).is_file():
        return True
    return bool(marker) and ".old-" in path.name and (path / marker).is_file()


@contextlib.contextmanager
def atomic_dir(final: Path, marker: str | None = None) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success replace ``final`` with it, on error delete it.

    A later stage or a server only ever sees ``final`` complete: the rename is atomic on
    one filesystem. Temporary folders are named ``.<name>.tmp-<id>`` so globbing for stage
    outputs never matches them, and hold :data:`TMP_MARKER` while they are written.

    ``marker``: a file (relative path) every folder this writer makes holds (``stage.json`` for a stage). An existing
    ``final`` that is not a folder, or a non-empty folder without it, was not written by trtpipe and is never replaced.

    Raises:
        PipelineError: ``final`` is someone else's file or folder (before anything is written).
    """
    final = Path(final)
    folder = final.is_dir() and not final.is_symlink()
    if marker and os.path.lexists(final) and (not folder or (any(final.iterdir()) and not (final / marker).exists())):
        from plugins.errors import PipelineError

        what = f"a folder without {marker} in it" if folder else "a link" if final.is_symlink() else "a file"
        raise PipelineError(f"{final} exists and was not written by trtpipe ({what}): it is left as it is. Fix: move "
                            "it away, or choose another output root (--out)")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        (tmp / TMP_MARKER).write_text(f"pid {os.getpid()}\n")
        yield tmp
        (tmp / TMP_MARKER).unlink(missing_ok=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        final.rename(old)
        with contextlib.suppress(OSError):
            (old / TMP_MARKER).write_text(f"pid {os.getpid()}\n")
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


FS_ERRORS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exceeded",
             errno.EROFS: "the filesystem is mounted read-only"}
"""The write failures that are about the disk, not the data (reported by :func:`write_failure`)."""
_FS_ERROR_TEXT = {"No space left on device": errno.ENOSPC, "os error 28)": errno.ENOSPC,
                  "Disk quota exceeded": errno.EDQUOT, "os error 122)": errno.EDQUOT,
                  "Read-only file system": errno.EROFS, "os error 30)": errno.EROFS}
"""How libraries that do not raise OSError say it (safetensors' Rust writer: ``... (os error 28)``)."""


def filesystem_errno(exc: BaseException) -> tuple[int, str | None] | None:
    """``(errno, file name or None)`` when ``exc``, or an exception it was raised from, is a disk-full, quota or
    read-only write failure (:data:`FS_ERRORS`); else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FS_ERRORS:
            return exc.errno, exc.filename
        if not isinstance(exc, OSError):
            text = str(exc)
            for needle, code in _FS_ERROR_TEXT.items():
                if needle in text:
                    return code, None
        exc = exc.__cause__ or exc.__context__
    return None


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds ``path`` (or the nearest folder above it that exists)."""
    p = existing_ancestor(path)
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def existing_ancestor(path: Path) -> Path:
    """``path`` itself when it exists, else the nearest folder above it that does."""
    p = Path(path).absolute()
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def _where_fix(path: Path) -> str:
    """The other place to write to: the cache has its variable, build outputs have --out."""
    try:
        Path(path).absolute().relative_to(cache_root().absolute())
        return "set TRTPIPE_CACHE to a folder on another disk"
    except ValueError:
        return "choose an output root on another disk with --out DIR"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def write_failure(exc: BaseException, path: Path, what: str, kept: str = "") -> WriteError | None:
    """A :class:`plugins.errors.WriteError` for ``exc`` when it is a disk-full, quota or read-only failure
    (:func:`filesystem_errno`), else None.

    ``path``: what was being written when the exception names no file; ``what``: who wrote it ("the engine stage");
    ``kept``: a clause on what was left behind."""
    from plugins.errors import WriteError

    found = filesystem_errno(exc)
    if found is None:
        return None
    code, filename = found
    target = Path(filename) if filename else Path(path)
    tmp_prefix = f".{Path(path).name}.tmp-"
    if filename and Path(path).parent in target.parents and \
            target.relative_to(Path(path).parent).parts[0].startswith(tmp_prefix):
        target = Path(path)  # a file of the temporary folder (removed by now): name the folder it was to become
    mount = mount_point(target)
    name = errno.errorcode.get(code, str(code))
    if code == errno.EROFS:
        detail, fix = f"{FS_ERRORS[code]} ({name}: {mount})", f"remount {mount} read-write, or {_where_fix(target)}"
    else:
        free = shutil.disk_usage(existing_ancestor(target)).free
        detail = f"{FS_ERRORS[code]} ({name}; {_mib(free)} free on {mount})"
        fix = f"free space on {mount} and rerun, or {_where_fix(target)}"
    return WriteError(f"{what} could not write {target}: {detail}{kept}. Fix: {fix}", path=target, errno=code)


@contextlib.contextmanager
def write_failures_reported(path: Path, what: str) -> Iterator[None]:
    """Turn a disk-full, quota or read-only failure in the block into a WriteError (:func:`write_failure`, ``path``
    when the failure names no file); every other exception passes as it is.

    Raises:
        WriteError: the block's write failed for one of those reasons.
    """
    from plugins.errors import PipelineError

    try:
        yield
    except PipelineError:
        raise
    except Exception as exc:
        err = write_failure(exc, path, what)
        if err is None:
            raise
        raise err from exc


def check_writable(path: Path, what: str) -> None:
    """Stop before any expensive step when ``path`` (or the nearest folder above it that exists, where it will be
    created) cannot be written: a file is in the way, its filesystem is mounted read-only, or no write permission.

    Raises:
        WriteError: names ``path``, the reason and the fix.
    """
    from plugins.errors import WriteError

    path = Path(path).absolute()
    probe = existing_ancestor(path)
    where = _where_fix(path)
    if not probe.is_dir():
        raise WriteError(f"{what} {path} cannot be created: {probe} is a file, not a folder. Fix: move {probe} "
                         f"away, or {where}", path=path, errno=errno.ENOTDIR)
    if os.statvfs(probe).f_flag & os.ST_RDONLY:
        mount = mount_point(probe)
        raise WriteError(f"{what} {path} cannot be written: {probe} is on a filesystem mounted read-only "
                         f"(EROFS: {mount}). Fix: remount {mount} read-write, or {where}", path=path, errno=errno.EROFS)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise WriteError(f"{what} {path} cannot be written: no write permission in {probe} (EACCES). Fix: give "
                         f"this user write access to {probe}, or {where}", path=path, errno=errno.EACCES)


def _lock_path(folder: Path) -> Path:
    """The lock file of output ``folder``: ``<cache>/locks/<first 16 hex digits of sha256(resolved path)>.lock``."""
    import hashlib

    name = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]
    return cache_root() / "locks" / f"{name}.lock"


class BuildBusy(Exception):
    """Output ``folder``'s build lock is held by a running build or deploy (:func:`build_lock` with ``wait=False``).

    Attributes:
        folder: the output folder.
        pid: the process id the holder recorded in the lock file (``None`` when it has not written it yet).
    """

    def __init__(self, folder: Path, pid: int | None):
        super().__init__(f"{folder} is in use by a running build (pid {pid if pid is not None else '?'})")
        self.folder = Path(folder)
        self.pid = pid


def _recorded_pid(fh) -> int | None:
    fh.seek(0)
    text = fh.read().strip()
    return int(text) if text.isdigit() else None


def build_lock_holder(folder: Path) -> BuildBusy | None:
    """Whether a running build (or deploy) holds output ``folder``'s lock, without taking it for longer than the probe.

    Returns:
        ``None`` when no process holds it (or it was never taken: no lock file is created), else a
        :class:`BuildBusy` naming the holder's pid.
    """
    import fcntl

    path = _lock_path(folder)
    try:
        fh = open(path)
    except OSError:  # no lock file (never taken), or no cache to hold one: no build holds it
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return BuildBusy(folder, _recorded_pid(fh))
        fcntl.flock(fh, fcntl.LOCK_UN)
        return None


@contextlib.contextmanager
def build_lock(folder: Path, *, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive lock (fcntl) for output ``folder`` for the duration of a build.

    A second build of the same output folder waits here (and says so) instead of racing the
    first one or deleting its temporary folders; ``trtpipe cache clean`` takes it with ``wait=False`` and
    leaves a folder in use alone. The lock file lives in the cache
    (``<cache>/locks/``), so a build that fails its checks leaves nothing in ``folder``; the
    lock dies with the process that held it. The holder's pid is written in it (:func:`build_lock_holder`).

    Raises:
        BuildBusy: ``wait`` is false and another process holds the lock.
    """
    import fcntl

    path = _lock_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _recorded_pid(fh)
            if not wait:
                raise BuildBusy(folder, pid) from None
            logging.getLogger("trtpipe").info("another build holds %s (pid %s): waiting for it", folder,
                                              pid if pid is not None else "?")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:  # the pid is only for messages and `cache list`: a full cache disk must not stop the build
            os.ftruncate(fh.fileno(), 0)
            os.write(fh.fileno(), str(os.getpid()).encode())
        except OSError as exc:
            logging.getLogger("trtpipe").warning(
                "could not record this build's pid in %s (%s): going on without it. Fix: free space there, or set "
                "TRTPIPE_CACHE to a folder on another disk", path, exc.strerror or exc)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_json(path: Path, data: object) -> None:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        tmp.replace(path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)  # never leave the temporary file (a full disk leaves it half-written)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed write() names no file: name the one it was for
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
