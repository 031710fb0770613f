"""Prefix caching on the portable runtime: block sharing on vs off, requests that share long system prompts.

For each setting of the tensorrt_llm model's ``enable_kv_cache_reuse`` (transformers' continuous batching
``allow_block_sharing``), copies the default build's repository with that parameter, starts tritonserver on it and
runs `trtpipe loadtest` (Triton gRPC ensemble, closed loop) with ``--shared-prefixes N`` for each N: request i
starts with prefix i mod N of ``--prefix-len`` tokens, then ``--input-len`` unique tokens, and asks for
``--output-len`` tokens. Prints a markdown table (TTFT p50/p99, E2E p50, request throughput, KV blocks in use
at the peak from the runtime's trtpipe_runtime_kv_cache_blocks gauges: the library reports no per-request reuse
count); ``--json`` keeps the numbers.

    make build-engine   # the default build (build/smollm2-135m/cpu)
    .venv/bin/python scripts/bench/bench_prefix_caching.py --prefixes 1,4 --json docs/benchmarks/prefix_caching.json
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

from pipeline.loadtest.api import run_loadtest  # noqa: E402
from pipeline.loadtest.config import LoadTestConfig  # noqa: E402
from pipeline.loadtest.selfcheck import serve_repository  # noqa: E402


def repo_with_reuse(src: Path, dst: Path, on: bool) -> Path:
    """A copy of the repository whose tensorrt_llm model has enable_kv_cache_reuse ``on`` (the only change)."""
    shutil.copytree(src, dst, symlinks=True)
    cfg = dst / "tensorrt_llm" / "config.pbtxt"
    text, n = re.subn(r'(key: "enable_kv_cache_reuse" value: \{ string_value: ")(\w+)(")',
                      lambda m: m.group(1) + ("true" if on else "false") + m.group(3), cfg.read_text())
    if n != 1:
        raise SystemExit(f"{cfg}: no enable_kv_cache_reuse parameter to set (regenerate the repository)")
    cfg.write_text(text)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, default=Path("build/smollm2-135m/cpu"))
    ap.add_argument("--prefixes", default="1,4")
    ap.add_argument("--prefix-len", type=int, default=960)
    ap.add_argument("--input-len", type=int, default=48)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--num-requests", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    src = args.build / "model_repo"
    if not (src / "tensorrt_llm" / "config.pbtxt").is_file():
        raise SystemExit(f"{src}: no model repository; run `make build-engine` first")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for on in (False, True):
            repo = repo_with_reuse(src, Path(tmp) / f"repo-{'on' if on else 'off'}", on)
            with serve_repository(repo, log_dir=Path(tmp)) as (grpc, metrics):
                for n in [int(x) for x in args.prefixes.split(",")]:
                    cfg = LoadTestConfig(url=grpc, metrics_url=metrics, mode="closed", concurrency=[args.concurrency],
                                         num_requests=args.num_requests, warmup=n, input_len=str(args.input_len),
                                         output_len=str(args.output_len), fixed_output="ignore_eos",
                                         tokenizer_dir=args.build / "engine", shared_prefixes=n,
                                         shared_prefix_len=args.prefix_len, seed=n)
                    p = run_loadtest(cfg)["points"][0]
                    s = p["summary"]
                    series = (p.get("server_metrics") or {}).get("runtime_gauges", [])
                    used = [r[t] - r[f] for r in series for t, f in [(
                        next((k for k in r if "kv_cache_blocks" in k and "total" in k), None),
                        next((k for k in r if "kv_cache_blocks" in k and "free" in k), None))] if t and f]
                    rows.append({"reuse": on, "prefixes": n, "ttft_p50_s": s["ttft_s"]["p50"],
                                 "ttft_p99_s": s["ttft_s"]["p99"], "e2e_p50_s": s["e2e_s"]["p50"],
                                 "req_s": s["request_throughput"], "failed": s["requests"]["failed"],
                                 "input_tokens_p50": s["input_tokens_per_request"]["p50"],
                                 "kv_blocks_used_max": max(used, default=None),
                                 "valid": p["validity"]["valid"]})
                    print(f"reuse {'on ' if on else 'off'} prefixes {n}: TTFT p50 {s['ttft_s']['p50'] * 1e3:.0f} ms, "
                          f"{s['request_throughput']:.2f} req/s", flush=True)
    print("\n| block sharing | shared prefixes | prompt tokens | TTFT p50 ms | TTFT p99 ms | E2E p50 s | req/s | "
          "KV blocks in use (peak) | TTFT vs off |")
    print("|---|---|---|---|---|---|---|---|---|")
    off = {r["prefixes"]: r for r in rows if not r["reuse"]}
    for r in rows:
        change = "" if not r["reuse"] else f"{100 * (r['ttft_p50_s'] / off[r['prefixes']]['ttft_p50_s'] - 1):+.0f}%"
        print(f"| {'on' if r['reuse'] else 'off'} | {r['prefixes']} | {r['input_tokens_p50']:.0f} | "
              f"{r['ttft_p50_s'] * 1e3:.0f} | {r['ttft_p99_s'] * 1e3:.0f} | {r['e2e_p50_s']:.2f} | {r['req_s']:.2f} | "
              f"{r['kv_blocks_used_max'] if r['kv_blocks_used_max'] is not None else '-'} | {change} |")
    if args.json:
        args.json.write_text(json.dumps({"host": {"platform": platform.platform(), "python": platform.python_version()},
                                         "args": vars(args) | {"json": str(args.json), "build": str(args.build)},
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
