"""A newcomer's first contact from nothing: the README's main command on a fresh clone, before and after a change,
idle and beside another 2-core job, paired in one run.

Each run clones ``--before`` or ``--after`` into a fresh folder under /tmp (the clone is not timed) and runs the
README's first command there, one make target at a time so each phase has its own time:

    make .venv/.setup-done    (set-up: what `make build-engine` runs first; the stamp both commits name so)
    make build-engine
    make serve ARGS='--http-port .. --grpc-port .. --metrics-port .. --openai-port ..'   (free ports: others serve here)
    make query PROMPT="What is the capital of France?"                                    (first token: its first byte)

then `make stop`, and removes the clone. pip's and uv's caches (and XDG_CACHE_HOME, HF_HOME) point into a fresh empty
folder per run, as a newcomer's would be; whatever the machine's pip config names (a local wheel folder or index)
is used by both sides alike. The other job is a 2-thread torch matmul loop. Order alternates between loads. The
1-minute load average is sampled every 5 s (the machine may be shared: "idle" means no job of ours beside it).

    python scripts/bench/bench_first_contact_full.py --before <commit> --after <commit> [--loads idle,busy]
        [--json out.json]      (run with a python that has torch, for the busy loop)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUSY = "import torch\ntorch.set_num_threads(2)\na = torch.randn(512, 512)\nwhile True:\n    a = (a @ a).tanh()\n"
PROMPT = "What is the capital of France?"
PHASE_TIMEOUT_S = 40 * 60


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class LoadSampler(threading.Thread):
    """The 1-minute load average every 5 s until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self.stop.wait(5)


def run_phase(cmd: list[str], cwd: Path, env: dict, log: Path) -> float:
    t0 = time.monotonic()
    with log.open("w") as f:
        r = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=PHASE_TIMEOUT_S)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed in {cwd} (exit {r.returncode}):\n{log.read_text()[-3000:]}")
    return wall


def run_query(cwd: Path, env: dict, log: Path) -> tuple[float, float]:
    """Seconds to the first byte of the answer (after make's echoed command line) and to the query's end."""
    t0 = time.monotonic()
    p = subprocess.Popen(["make", "query", f"PROMPT={PROMPT}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    buf, first = b"", None
    while True:
        chunk = os.read(p.stdout.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
        if first is None and b"\n" in buf and buf.split(b"\n", 1)[1].strip():
            first = time.monotonic() - t0
    rc = p.wait()
    total = time.monotonic() - t0
    log.write_bytes(buf)
    if rc != 0 or first is None:
        raise RuntimeError(f"make query failed in {cwd} (exit {rc}):\n{buf.decode(errors='replace')[-3000:]}")
    return first, total


def one_run(commit: str, load: str, busy_python: str, keep_logs: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix="first-contact-full-", dir="/tmp"))
    clone, caches = root / "clone", root / "caches"
    caches.mkdir()
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", commit], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRTPIPE_", "VIRTUAL_ENV", "UV_"))}
    env.update(PIP_CACHE_DIR=str(caches / "pip"), UV_CACHE_DIR=str(caches / "uv"), XDG_CACHE_HOME=str(caches),
               HF_HOME=str(caches / "hf"), PATH=":".join(p for p in env["PATH"].split(":") if "/.venv/" not in p))
    busy = subprocess.Popen([busy_python, "-c", BUSY]) if load == "busy" else None
    sampler = LoadSampler()
    phases: dict[str, float] = {}
    try:
        time.sleep(3 if busy else 0)
        sampler.start()
        t0 = time.monotonic()
        phases["setup_s"] = run_phase(["make", ".venv/.setup-done"], clone, env, keep_logs / "setup.log")
        phases["build_s"] = run_phase(["make", "build-engine"], clone, env, keep_logs / "build.log")
        http, grpc, metrics, openai = free_ports(4)
        args = f"ARGS=--http-port {http} --grpc-port {grpc} --metrics-port {metrics} --openai-port {openai}"
        phases["serve_s"] = run_phase(["make", "serve", args], clone, env, keep_logs / "serve.log")
        t_query = time.monotonic() - t0
        first, total = run_query(clone, env, keep_logs / "query.log")
        phases["first_token_s"] = first
        result = {"to_first_token_s": round(t_query + first, 1), "to_answer_s": round(t_query + total, 1)}
    finally:
        sampler.stop.set()
        if busy:
            busy.kill()
            busy.wait()
        subprocess.run(["make", "stop"], cwd=clone, env=env, capture_output=True, timeout=300)
        setup_log = (keep_logs / "setup.log").read_text() if (keep_logs / "setup.log").exists() else ""
        sizes = subprocess.run(["du", "-sm", *[str(p) for p in clone.iterdir() if p.name.startswith(".")
                                                 and p.is_dir() and p.name != ".git"], str(caches)],
                               capture_output=True, text=True).stdout
        shutil.rmtree(root, ignore_errors=True)
    samples = sampler.samples or [os.getloadavg()[0]]
    return {**result, **{k: round(v, 1) for k, v in phases.items()},
            "installer": "uv" if "installing with uv" in setup_log else "pip",
            "load1_mean": round(sum(samples) / len(samples), 2), "load1_min": round(min(samples), 2),
            "load1_max": round(max(samples), 2),
            "disk_mb": {Path(line.split("\t")[1]).name: int(line.split("\t")[0])
                        for line in sizes.splitlines() if "\t" in line}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git commit of the 'before' side")
    ap.add_argument("--after", default="HEAD", help="git commit of the 'after' side (default HEAD)")
    ap.add_argument("--loads", default="idle,busy")
    ap.add_argument("--busy-python", default=sys.executable, help="a python with torch, for the busy loop")
    ap.add_argument("--json", default=None)
    ap.add_argument("--logs", default=None, help="keep each run's make logs under this folder")
    args = ap.parse_args()
    commits = {name: subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", c], check=True,
                                    capture_output=True, text=True).stdout.strip()
               for name, c in (("before", args.before), ("after", args.after))}
    logs = Path(args.logs or tempfile.mkdtemp(prefix="first-contact-logs-"))
    rows = []
    for i, load in enumerate(args.loads.split(",")):
        order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
        for name in order:
            run_logs = logs / f"{name}-{load}"
            run_logs.mkdir(parents=True, exist_ok=True)
            print(f"[bench] {time.strftime('%H:%M:%S')} {name} ({commits[name]}) {load}, load "
                  f"{os.getloadavg()[0]:.2f} ...", flush=True)
            res = {"version": name, "commit": commits[name], "load": load,
                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   **one_run(commits[name], load, args.busy_python, run_logs)}
            rows.append(res)
            print(f"[bench] {json.dumps(res)}", flush=True)
            if args.json:  # after every run: a long run cut short still leaves what it measured
                Path(args.json).write_text(json.dumps(
                    {"before": commits["before"], "after": commits["after"], "cores": os.cpu_count(),
                     "date": time.strftime("%Y-%m-%d"), "command": "README: make build-engine && make serve && "
                     "make query PROMPT=...", "caches": "empty pip/uv/XDG/HF caches per run; the machine's pip "
                     "config (local wheel folder and indexes) used by both", "rows": rows}, indent=1) + "\n")
    print("\n| version | load | load1 mean (min-max) | installer | set-up s | build s | serve s | first token s | "
          "to first token s |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['version']} {r['commit']} | {r['load']} | {r['load1_mean']} ({r['load1_min']}-{r['load1_max']}) "
              f"| {r['installer']} | {r['setup_s']} | {r['build_s']} | {r['serve_s']} | {r['first_token_s']} | "
              f"{r['to_first_token_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
