"""The build cache: list and clean stage folders under ``build/``.

A stage folder is ``<root>/<build>/<target>/<stage>/`` with a ``stage.json`` naming its key.
Temporary folders (``.<stage>.tmp-*``, ``.<stage>.old-*``) are what a killed build left
behind: never read, always safe to delete.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CacheEntry:
    """One finished stage folder (or a temporary folder left by an interrupted build)."""

    build: str
    target: str
    stage: str
    key: str | None
    path: Path
    age_days: float
    size_bytes: int
    temporary: bool = False


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def entries(root: Path) -> list[CacheEntry]:
    """Every stage folder and temporary folder under ``root`` (``<build>/<target>/<stage>``)."""
    out = []
    now = time.time()
    for leaf in sorted(p for p in Path(root).glob("*/*/*") if p.is_dir()):
        build, target, stage = leaf.parts[-3:]
        marker = leaf / "stage.json"
        temporary = stage.startswith(".") and (".tmp-" in stage or ".old-" in stage)
        if not (marker.is_file() or temporary):
            continue
        key = json.loads(marker.read_text()).get("key") if marker.is_file() else None
        age = (now - leaf.stat().st_mtime) / 86400
        out.append(CacheEntry(build, target, stage, key, leaf, age, _size(leaf), temporary))
    return out


def clean(root: Path, *, older_than_days: float | None = None, build: str | None = None,
          dry_run: bool = False) -> list[CacheEntry]:
    """Delete matching stage folders (and every temporary folder); return what was removed."""
    removed = []
    for e in entries(root):
        if build is not None and e.build != build:
            continue
        if not e.temporary and older_than_days is not None and e.age_days < older_than_days:
            continue
        if not dry_run:
            shutil.rmtree(e.path, ignore_errors=True)
            manifest = e.path.parent / "manifest.json"
            if manifest.is_file() and not any((e.path.parent / n / "stage.json").is_file()
                                              for n in ("checkpoint", "engine", "model_repo", "bundle")):
                manifest.unlink()
        removed.append(e)
    return removed
