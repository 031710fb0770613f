"""A newcomer's first `make build-engine`: the default build's wall time, idle and beside another 2-core job,
before and after a change, paired in one run.

Each run is the whole default build (`trtpipe build configs/builds/smollm2-135m.yaml --target cpu`) into a fresh
output root and a fresh cache copy of the converted model (so nothing is reused but the GGUF conversion, which a
newcomer also pays once, in `make setup` time). "Before" runs the sources of ``--before`` (a git worktree, first on
PYTHONPATH) with the same virtual environment; "after" runs this checkout. The other job is a 2-thread torch
matmul loop (what a second build or a notebook on the laptop looks like to the scheduler). Order alternates so a
drift of the machine hits both versions alike.

    python scripts/bench/bench_first_contact.py --before <commit> [--loads idle,busy] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
BUSY = "import torch\ntorch.set_num_threads(2)\na = torch.randn(512, 512)\nwhile True:\n    a = (a @ a).tanh()\n"


def one_build(src: Path, load: str, cache: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="first-contact-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",)}
        env.update(PYTHONPATH=str(src), TRTPIPE_CACHE=str(cache), TRTPIPE_HOME=tmp)
        busy = subprocess.Popen([str(PY), "-c", BUSY]) if load == "busy" else None
        try:
            time.sleep(2 if busy else 0)
            t0 = time.monotonic()
            r = subprocess.run([str(PY), "-m", "pipeline.cli", "build", str(REPO / "configs/builds/smollm2-135m.yaml"),
                                "--target", "cpu", "--out", f"{tmp}/build", "--no-progress"], cwd=tmp, env=env,
                               capture_output=True, text=True)
            wall = time.monotonic() - t0
        finally:
            if busy:
                busy.kill()
                busy.wait()
        if r.returncode != 0:
            raise SystemExit(f"build failed ({src}, {load}):\n{r.stderr[-3000:]}")
        out = Path(tmp) / "build" / "smollm2-135m" / "cpu"
        manifest = json.loads((out / "manifest.json").read_text())
        verify = json.loads((out / "verify" / "verify.json").read_text())
        stages = {k: round(v["timing"].get("wall_s", 0), 1) for k, v in manifest["stages"].items()}
        return {"wall_s": round(wall, 1), "stages_s": stages,
                "calibration_s": manifest.get("calibration", {}).get("calibration_s"),
                "verify": {k: verify["metrics"][k] for k in ("perplexity_delta_pct", "top1_agreement", "mean_kl")},
                "passed": verify["passed"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git commit of the 'before' sources")
    ap.add_argument("--loads", default="idle,busy")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    loads = args.loads.split(",")
    base_cache = Path(os.environ.get("TRTPIPE_CACHE") or REPO / ".cache")
    with tempfile.TemporaryDirectory(prefix="first-contact-src-") as wt:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", wt, args.before], check=True,
                       capture_output=True)
        try:
            rows = []
            for i, load in enumerate(loads):
                order = [("before", Path(wt)), ("after", REPO)]
                for name, src in (order if i % 2 == 0 else order[::-1]):
                    with tempfile.TemporaryDirectory(prefix="first-contact-cache-") as cache:
                        models = base_cache / "models"
                        if models.is_dir():
                            shutil.copytree(models, Path(cache) / "models")
                        print(f"[bench] {name} {load} ...", flush=True)
                        res = one_build(src, load, Path(cache))
                    rows.append({"version": name, "load": load, **res})
                    print(f"[bench] {name} {load}: {res['wall_s']} s (stages {res['stages_s']})", flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", wt], capture_output=True)
    print("\n| version | load | build wall s | quantize (checkpoint) s | calibration s | ppl delta % | top-1 | "
          "verify |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['version']} | {r['load']} | {r['wall_s']} | {r['stages_s'].get('checkpoint', '-')} | "
              f"{r['calibration_s']} | {r['verify']['perplexity_delta_pct']:+.2f} | "
              f"{r['verify']['top1_agreement']:.4f} | {'pass' if r['passed'] else 'FAIL'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"before": args.before, "cores": os.cpu_count(),
                                               "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
