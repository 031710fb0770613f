"""How far aiconfigurator's predictions are from TensorRT-LLM's published numbers, and what predicting costs.

1. Max-throughput points of TensorRT-LLM's perf-overview (docs/source/performance/perf-overview.md, NVIDIA/
   TensorRT-LLM commit 00f37686: trtllm-bench throughput, PyTorch backend, NVIDIA's ModelOpt FP8 checkpoints,
   every request at once) against aiconfigurator's best output tokens/s over batch sizes 16..2048 at the same
   ISL/OSL, tp and FP8 weights + FP8 KV cache (ctx_tokens 8192 = trtllm-bench's default max_num_tokens; KV
   memory fraction 0.9, its default; a batch size aiconfigurator says overflows the KV cache is not counted).
   Two GEMM modes: fp8_static (ModelOpt's static scales, what the plan uses) and fp8 (dynamic activation scales).
2. The wall time of ``trtpipe tune`` for the llama-3-8b build on h200 (a full search, cold and cached) and what
   the predictions add to ``trtpipe plan`` (cold and cached), on this machine.

    python scripts/bench/bench_prediction.py [--json docs/benchmarks/prediction.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

PUBLISHED = [  # (model asset, system, tp, isl, osl, output tok/s): perf-overview.md at NVIDIA/TensorRT-LLM 00f37686
    ("llama-3.1-8b", "h200_sxm", 1, 128, 128, 27911), ("llama-3.1-8b", "h200_sxm", 1, 1000, 1000, 17744),
    ("llama-3.1-8b", "h200_sxm", 1, 2048, 2048, 12194),
    ("llama-3.1-8b", "h100_sxm", 1, 128, 128, 28312), ("llama-3.1-8b", "h100_sxm", 1, 1000, 1000, 15220),
    ("llama-3.1-8b", "h100_sxm", 1, 2048, 2048, 9305),
    ("llama-3.3-70b", "h200_sxm", 1, 128, 128, 3803), ("llama-3.3-70b", "h200_sxm", 1, 1000, 1000, 2909),
    ("llama-3.3-70b", "h200_sxm", 1, 2048, 2048, 2003),
    ("llama-3.3-70b", "h100_sxm", 2, 128, 128, 6378), ("llama-3.3-70b", "h100_sxm", 2, 1000, 1000, 4205),
    ("llama-3.3-70b", "h100_sxm", 2, 2048, 2048, 3082),
]
BATCHES = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048)


def validation() -> list[dict]:
    from builders import perf_model

    rows, points = [], []
    for asset, system, tp, isl, osl, pub in PUBLISHED:
        cfg = json.loads((REPO / "tests" / "assets" / asset / "config.json").read_text())
        mdir = str(perf_model.model_dir(cfg))
        for gemm in ("fp8_static", "fp8"):
            for bs in BATCHES:
                points.append({"model_dir": mdir, "system": system, "backend": "trtllm", "isl": isl, "osl": osl,
                               "batch_size": bs, "ctx_tokens": 8192, "tp_size": tp, "pp_size": 1,
                               "gemm_quant_mode": gemm, "kvcache_quant_mode": "fp8",
                               "free_gpu_memory_fraction": 0.9, "_row": (asset, system, tp, isl, osl, pub, gemm)})
    answers, _ = perf_model.estimate([{k: v for k, v in p.items() if k != "_row"} for p in points])
    best: dict[tuple, dict] = {}
    for p, a in zip(points, answers):
        if not a.get("ok") or a.get("kv_cache_warning"):
            continue
        k = p["_row"]
        if k not in best or a["tokens_per_s"] > best[k]["tokens_per_s"]:
            best[k] = {**a, "batch_size": p["batch_size"]}
    for asset, system, tp, isl, osl, pub in PUBLISHED:
        row = {"model": asset, "system": system, "tp": tp, "isl": isl, "osl": osl, "published": pub}
        for gemm in ("fp8_static", "fp8"):
            a = best.get((asset, system, tp, isl, osl, pub, gemm))
            row[gemm] = None if a is None else {"tokens_per_s": round(a["tokens_per_s"]), "batch": a["batch_size"],
                                                "error_pct": round(100 * (a["tokens_per_s"] / pub - 1), 1),
                                                "mode": a["database_mode"], "version": a["backend_version"]}
        rows.append(row)
    return rows


def _timed(cmd: list[str], env: dict) -> float:
    t = time.monotonic()
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return round(time.monotonic() - t, 2)


def timings() -> dict:
    trtpipe = str(REPO / ".venv" / "bin" / "trtpipe")
    build = ["configs/builds/llama-3-8b.yaml", "--target", "h200"]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TRTPIPE_CACHE": tmp}
        plan = [trtpipe, "plan", *build, "--isl", "1000", "--osl", "1000", "--no-progress",
                "--output", f"{tmp}/plan.json"]
        out["plan_without_predictions_s"] = _timed(plan + ["--no-predict"], env)
        out["plan_cold_s"] = _timed(plan, env)
        out["plan_cached_s"] = _timed(plan, env)
        tune = [trtpipe, "tune", *build, "--isl", "1000", "--osl", "1000", "--ttft-ms", "500", "--tpot-ms", "20",
                "--no-progress", "--force", "--output", f"{tmp}/tuned.yaml"]
        out["tune_cold_s"] = _timed(tune, env)
        out["tune_cached_s"] = _timed(tune, env)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRTPIPE_CACHE"] = tmp  # cold: nothing cached
        rows = validation()
    print("| model | GPU | tp | ISL/OSL | published tok/s | fp8_static predicted (batch) | error | "
          "fp8 dynamic predicted (batch) | error |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        cells = []
        for g in ("fp8_static", "fp8"):
            a = r[g]
            cells += ["-", "-"] if a is None else [f"{a['tokens_per_s']:,} ({a['batch']})", f"{a['error_pct']:+.1f}%"]
        print(f"| {r['model']} | {r['system']} | {r['tp']} | {r['isl']}/{r['osl']} | {r['published']:,} | "
              + " | ".join(cells) + " |")
    t = timings()
    print("\n| step | wall s |\n|---|---:|")
    for k, v in t.items():
        print(f"| {k} | {v} |")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d"), "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count(), "command": "python scripts/bench/bench_prediction.py --json " + args.json,
                "source": "NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md @ 00f37686"}
        Path(args.json).write_text(json.dumps({"meta": meta, "validation": rows, "timings": t}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
