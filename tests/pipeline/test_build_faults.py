"""Builds under faults: SIGKILL at every stage boundary and mid-stage, a full disk, a read-only output root, user
folders where trtpipe writes.

`trtpipe build` runs in child processes on the tiny random Llama (portable pytorch runtime, cpu target). After a
fault only finished stage folders exist (their files equal a clean build's), a rerun completes, and an error names
the path and the fix. The full and read-only disks are tmpfs mounts (root, CAP_SYS_ADMIN, or a user and mount
namespace: `unshare --user --map-root-user --mount`); where mounting is refused those tests fail, never skip.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from builders.spec import load_spec
from pipeline.build import run_build
from plugins.errors import WriteError
from plugins.fsutil import TMP_MARKER
from tests.conftest import REPO, write_spec

pytestmark = pytest.mark.slow  # a clean build and about a dozen short ones: about a minute on 2 cores

STAGES = ("checkpoint", "verify", "engine", "model_repo", "deploy")


def _files(stage_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of a stage folder but stage.json (timings); verify.json without its *_s timings, a
    .safetensors file with its header's keys sorted (safetensors writes the metadata map in a per-process order)."""
    out = {}
    for f in sorted(p for p in stage_dir.rglob("*") if p.is_file() and p.name != "stage.json"):
        data = f.read_bytes()
        if f.name == "verify.json":
            data = json.dumps({k: v for k, v in json.loads(data).items() if not k.endswith("_s")}, sort_keys=True).encode()
        elif f.suffix == ".safetensors":
            n = int.from_bytes(data[:8], "little")
            data = json.dumps(json.loads(data[8:8 + n]), sort_keys=True).encode() + data[8 + n:]
        out[str(f.relative_to(stage_dir))] = hashlib.sha256(data).hexdigest()
    return out


@dataclass
class Clean:
    """A clean build of the tiny model (built in ``<base>/out``, then moved to ``ref`` so faulted builds reuse the
    path, and with it every stage key)."""

    base: Path
    spec: Path
    cache: Path
    keys: dict[str, str]
    files: dict[str, dict[str, str]]
    ref: Path

    def cmd(self, out: Path) -> list[str]:
        return [sys.executable, "-m", "pipeline.cli", "build", str(self.spec), "--target", "cpu", "--out", str(out),
                "--no-progress"]

    def env(self, **extra: str) -> dict:
        return {**os.environ, "TRTPIPE_CACHE": str(self.cache), **extra}

    def run(self, out: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
        t0 = time.monotonic()
        res = subprocess.run(self.cmd(out), cwd=REPO, env=self.env(**env), capture_output=True, text=True, timeout=300)
        return res, time.monotonic() - t0


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_llama) -> Clean:
    base = tmp_path_factory.mktemp("faults")
    spec = write_spec(base / "b.yaml", tiny_llama, target="cpu", runtime="pytorch",
                      extra="gates: {eval_samples: 2, eval_seq_len: 32}\n")  # a short verify
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTPIPE_CACHE", str(base / "cache"))
        m = run_build(load_spec(spec, "cpu"), out_root=base / "out", progress=False)
    leaf = base / "out" / "tiny" / "cpu"
    keys = {s: m["stages"][s]["key"] for s in STAGES}
    files = {s: _files(leaf / s) for s in STAGES}
    (base / "out").rename(base / "ref")
    return Clean(base, spec, base / "cache", keys, files, base / "ref" / "tiny" / "cpu")


@contextlib.contextmanager
def _tmpfs(path: Path, size: str, *, read_only: bool = False):
    """A tmpfs of ``size`` at ``path`` for the block, unmounted after it. Where mounting is not permitted the test
    fails (never skips): the disk faults are then not tested. A full disk (ENOSPC) and a read-only mount (EROFS) are
    what the product's messages are about; a file-size limit (EFBIG) or a chmod-ed folder (EACCES, and nothing for
    root) take other paths. Unprivileged, run the suite in a user and mount namespace, where tmpfs mounts work:
    ``unshare --user --map-root-user --mount .venv/bin/python -m pytest ...``."""
    how = ("run the tests as root, with CAP_SYS_ADMIN, or unprivileged under `unshare --user --map-root-user "
           "--mount` (a tmpfs mount needs one of them)")
    if shutil.which("mount") is None:
        pytest.fail(f"no mount command here: the disk-fault tests need one to mount a tmpfs ({how})")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}" + (",ro" if read_only else ""), "tmpfs",
                          str(path)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs at {path}: {res.stderr.strip()}. The disk faults are not tested: {how}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True)


def _fill(path: Path) -> None:
    """Write a filler file until the filesystem of ``path`` has no free byte left."""
    with open(path / "filler", "wb", buffering=0) as fh:
        for chunk in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * chunk)
    assert shutil.disk_usage(path).free == 0


def _kill_when(cmd: list[str], env: dict, log: Path, ready, timeout: float = 300) -> bool:
    """Run ``cmd``; SIGKILL its process group as soon as ``ready()`` holds. True: killed; False: it ended first."""
    with open(log, "w") as fh:
        child = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while child.poll() is None:
            if ready():
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return True
            assert time.monotonic() < deadline, f"{cmd} did not reach the kill point in {timeout} s: {log.read_text()}"
            time.sleep(0.001)
        return False
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def _finished(leaf: Path, clean: Clean) -> list[str]:
    """The stage folders that exist; each must be complete: the clean build's key and files. Raise otherwise."""
    done = []
    for s in STAGES:
        if not os.path.lexists(leaf / s):
            continue
        assert (leaf / s / "stage.json").is_file(), f"{leaf / s} exists without stage.json: half-written"
        assert json.loads((leaf / s / "stage.json").read_text())["key"] == clean.keys[s]
        assert _files(leaf / s) == clean.files[s], f"{leaf / s} differs from the clean build's"
        done.append(s)
    assert list(STAGES[:len(done)]) == done, f"stages finished out of order: {done}"
    return done


def _temps(leaf: Path) -> list[str]:
    return sorted(p.name for p in leaf.glob(".*.tmp-*")) + sorted(p.name for p in leaf.glob(".*.old-*"))


def test_sigkill_at_every_stage_boundary_and_mid_stage(clean, tmp_path):
    """Each run is killed at the next point and is the rerun of the one before: mid-checkpoint (its temporary folder
    exists), then right after each stage's folder appears. Every kill leaves only complete stage folders, the next run
    reuses exactly those (and removes the temporary folder), and the last run equals the clean build."""
    out = clean.base / "out"  # the clean build's path: same stage keys (the repository names the engine path)
    leaf = out / "tiny" / "cpu"
    points = [("mid-checkpoint", lambda: any(leaf.glob(f".checkpoint.tmp-*/{TMP_MARKER}")))]
    points += [(s, lambda s=s: (leaf / s / "stage.json").is_file()) for s in STAGES]
    before: list[str] = []
    had_temps = False
    report = []
    for i, (point, ready) in enumerate(points):
        log = tmp_path / f"run{i}.log"
        t0 = time.monotonic()
        assert _kill_when(clean.cmd(out), clean.env(), log, ready), f"the build ended before the kill at {point}"
        text = log.read_text()
        for s in before:  # the rerun of the last kill reused what that kill left
            assert re.search(rf"{s}\s+up to date", text), f"run {i} did not reuse {s}: {text}"
        if had_temps:
            assert "left by an interrupted build" in text
        done, temps = _finished(leaf, clean), _temps(leaf)
        if point == "mid-checkpoint":
            assert done == [] and any(t.startswith(".checkpoint.tmp-") for t in temps), temps
        else:
            assert point in done
        report.append(f"kill at {point:<14} after {time.monotonic() - t0:5.1f} s: finished {done}, temporary {temps}")
        before, had_temps = done, bool(temps)

    res, wall = clean.run(out)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert _finished(leaf, clean) == list(STAGES) and not _temps(leaf) and not list(leaf.rglob(TMP_MARKER))
    m = json.loads((leaf / "manifest.json").read_text())
    assert {s: m["stages"][s]["key"] for s in STAGES} == clean.keys
    assert {s: m["stages"][s]["cached"] for s in STAGES} == {s: s in before for s in STAGES}
    print("\n".join(report + [f"final rerun {wall:.1f} s, reused {before}"]))


def test_full_output_disk_names_the_path_and_the_rerun_completes(clean, tmp_path):
    """A 12 MiB tmpfs holding the clean build's checkpoint and verify folders (9.6 MiB, what an earlier run left):
    the engine stage (9.6 MiB) runs out of space. The CLI says where and what to do (exit 2, no traceback) and leaves
    no partial engine; after the tmpfs is made larger the rerun reuses both stages and completes."""
    root = tmp_path / "small"
    leaf = root / "tiny" / "cpu"
    with _tmpfs(root, "12m"):
        for s in ("checkpoint", "verify"):
            shutil.copytree(clean.ref / s, leaf / s)
        res, wall = clean.run(root)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        err = res.stderr.strip().splitlines()[-1]
        assert err.startswith(f"error: the engine stage could not write {leaf / 'engine'}: the disk is full (ENOSPC;")
        assert f"free on {root})" in err and "partial output was removed" in err
        assert f"Fix: free space on {root} and rerun, or choose an output root on another disk with --out" in err
        assert not os.path.lexists(leaf / "engine") and not _temps(leaf) and not list(root.rglob(f"*{TMP_MARKER}"))
        assert _finished(leaf, clean) == ["checkpoint", "verify"]

        _remount(root, "size=64m")
        res2, wall2 = clean.run(root)
        assert res2.returncode == 0, res2.stderr
        m = json.loads((leaf / "manifest.json").read_text())
        assert {s: st["cached"] for s, st in m["stages"].items() if s != "model"} == {
            "checkpoint": True, "verify": True, "engine": False, "model_repo": False, "deploy": False}
        assert _files(leaf / "engine") == clean.files["engine"] and not _temps(leaf)
    print(f"\nfull disk: failed after {wall:.1f} s ({err}); rerun after remount {wall2:.1f} s")


def test_full_disk_in_the_checkpoint_stage(clean, tmp_path, monkeypatch):
    """ModelOpt's export error wraps the ENOSPC (a StageError from safetensors' SafetensorError): still a WriteError
    that names the stage folder; only plan.json (complete) is left on the 4 MiB disk. With the disk filled to the
    last byte, plan.json itself cannot be replaced: a WriteError naming it, the old one intact, no temporary file."""
    monkeypatch.setenv("TRTPIPE_CACHE", str(clean.cache))
    root = tmp_path / "tiny-disk"
    leaf = root / "tiny" / "cpu"
    with _tmpfs(root, "4m"):
        with pytest.raises(WriteError) as exc:
            run_build(load_spec(clean.spec, "cpu"), out_root=root, progress=False)
        assert exc.value.errno == errno.ENOSPC and exc.value.path == leaf / "checkpoint"
        assert str(exc.value).startswith(f"the checkpoint stage could not write {leaf / 'checkpoint'}: the disk is full")
        assert sorted(p.name for p in leaf.iterdir()) == ["plan.json"]
        plan = (leaf / "plan.json").read_text()

        _fill(root)
        with pytest.raises(WriteError, match=f"^the build could not write {leaf / 'plan.json'}: the disk is full") as exc:
            run_build(load_spec(clean.spec, "cpu"), out_root=root, progress=False)
        assert exc.value.errno == errno.ENOSPC and f"Fix: free space on {root} and rerun" in str(exc.value)
        assert sorted(p.name for p in leaf.iterdir()) == ["plan.json"] and (leaf / "plan.json").read_text() == plan


def test_full_cache_disk_costs_only_the_memo(clean, tmp_path):
    """TRTPIPE_CACHE on a full tmpfs: the build lock still works, the pid and the digest memo are not recorded (a
    warning names the cache file and the fix), no half-written file is left there, and the build completes."""
    out = tmp_path / "out"
    shutil.copytree(clean.ref, out / "tiny" / "cpu")
    cache = tmp_path / "cache"
    with _tmpfs(cache, "1m"):
        _fill(cache)
        res, wall = clean.run(out, TRTPIPE_CACHE=str(cache))
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
        assert f"could not record this build's pid in {cache / 'locks'}" in res.stderr
        assert "Fix: free space there, or set TRTPIPE_CACHE to a folder on another disk" in res.stderr
        assert f"could not record the digest in {cache / 'digests.json'}" in res.stderr
        left = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
        assert len(left) == 2 and left[0] == "filler" and left[1].startswith("locks/"), left
        assert (cache / left[1]).stat().st_size == 0
    print(f"\nfull cache: build completed in {wall:.1f} s with warnings")


def test_read_only_output_root_or_cache_stops_before_any_work(clean, tmp_path):
    """A read-only output root (and then a read-only cache): exit 2 before the model is read or a stage starts,
    naming the folder, the mount and the fix."""
    root = tmp_path / "ro"
    with _tmpfs(root, "1m", read_only=True):
        res, wall = clean.run(root)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert (f"error: the build folder {root / 'tiny' / 'cpu'} cannot be written: {root} is on a filesystem mounted "
            f"read-only (EROFS: {root}). Fix: remount {root} read-write, or choose an output root on another disk "
            "with --out DIR") in res.stderr
    assert "hashing source" not in res.stderr and "running" not in res.stderr

    cache, out = tmp_path / "ro-cache", tmp_path / "out"
    with _tmpfs(cache, "1m", read_only=True):
        res2, wall2 = clean.run(out, TRTPIPE_CACHE=str(cache))
    assert res2.returncode == 2 and "Traceback" not in res2.stderr, res2.stderr
    assert f"error: the cache ($TRTPIPE_CACHE) {cache} cannot be written" in res2.stderr
    assert "set TRTPIPE_CACHE to a folder on another disk" in res2.stderr and not out.exists()
    print(f"\nread-only root: refused in {wall:.1f} s; read-only cache: refused in {wall2:.1f} s")


def test_user_folders_where_trtpipe_writes_are_left_alone(clean, tmp_path):
    """A user's folders named like a stage's temporary folders and a user's folder at the verify stage's path: the
    build reuses the checkpoint, refuses to replace the verify folder (exit 2, naming it) and deletes none of them;
    ``trtpipe cache clean`` deletes only the stage folder it made."""
    out = tmp_path / "out"
    leaf = out / "tiny" / "cpu"
    shutil.copytree(clean.ref / "checkpoint", leaf / "checkpoint")
    mine = {leaf / ".checkpoint.tmp-mine" / "notes.txt": "a", leaf / ".verify.old-mine" / "notes.txt": "b",
            leaf / "verify" / "results.txt": "c", leaf / ".engine.tmp-x" / "sub" / "f.txt": "d"}
    for path, text in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    res, _ = clean.run(out)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"error: {leaf / 'verify'} exists and was not written by trtpipe" in res.stderr
    assert re.search(r"checkpoint\s+up to date", res.stderr)
    assert f"leaving {leaf / '.checkpoint.tmp-mine'} as it is: trtpipe did not make it" in res.stderr
    assert {p: p.read_text() for p in mine} == mine

    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "cache", "clean", "--out", str(out)], cwd=REPO,
                         env=clean.env(), capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert {p: p.read_text() for p in mine} == mine and not (leaf / "checkpoint").exists()
