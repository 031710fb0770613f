"""Memoised source-checkpoint digests.

Hashing a checkpoint's bytes takes seconds (270 MB for SmolLM2-135M); a no-op rebuild must
not pay that. :func:`source_digest` keeps ``<cache>/digests.json``: for each folder, a
fingerprint of its files' relative names, sizes, modification and status-change times
(nanoseconds) and inode numbers, and the SHA-256 of their contents. The status-change time (ctime) is
what no copy tool can restore: ``cp -p`` and ``rsync -a`` put back the mtime of a changed file of the
same size, never its ctime. When the fingerprint is unchanged the stored digest is
returned; otherwise the folder is hashed again and the entry replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from plugins.fsutil import cache_root, write_json

log = logging.getLogger("trtpipe")
MEMO_NAME = "digests.json"


def fingerprint(path: Path) -> str:
    """SHA-256 of (relative name, size, mtime_ns, ctime_ns, inode) of every file under ``path``: cheap, stat only."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\n".encode())
    return h.hexdigest()


def source_digest(path: Path, memo: Path | None = None) -> str:
    """Content digest of a checkpoint folder (as :func:`builders.model_fetch.folder_digest`), memoised."""
    from builders.model_fetch import folder_digest

    path = Path(path).resolve()
    memo = memo or cache_root() / MEMO_NAME
    fp = fingerprint(path)
    try:
        entries = json.loads(memo.read_text()) if memo.is_file() else {}
    except (OSError, ValueError):
        entries = {}
    hit = entries.get(str(path))
    if isinstance(hit, dict) and hit.get("fingerprint") == fp and hit.get("sha256"):
        return hit["sha256"]
    log.info("hashing source checkpoint %s (files changed since the last build or first use)", path)
    digest = folder_digest(path)
    entries[str(path)] = {"fingerprint": fp, "sha256": digest}
    try:
        write_json(memo, entries)
    except OSError as exc:  # a read-only cache only costs speed
        log.warning("could not record the digest in %s: %s", memo, exc)
    return digest
