"""The memoised source digest notices a same-size change whose mtime was put back (cp -p, rsync -a)."""

from __future__ import annotations

import os
import time

from builders.digest import source_digest


def test_a_same_size_change_with_the_mtime_restored_is_rehashed(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    f = src / "model.safetensors"
    f.write_bytes(b"A" * 1024)
    memo = tmp_path / "digests.json"
    first = source_digest(src, memo)
    assert source_digest(src, memo) == first  # memoised
    st = f.stat()
    time.sleep(0.01)
    f.write_bytes(b"B" * 1024)  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # what cp -p / rsync -a do
    assert f.stat().st_mtime_ns == st.st_mtime_ns and f.stat().st_size == st.st_size
    assert source_digest(src, memo) != first
