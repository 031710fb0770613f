"""Overload soak of a built repository: measure its capacity, then an open loop at a multiple of it.

    python scripts/bench/bench_soak.py --minutes 30 --json docs/benchmarks/soak.json

Starts tritonserver on the build's repository (127.0.0.1, free ports), measures the completed requests/s of a
closed loop at max_batch_size, then sends a Poisson open loop at ``--overload`` times that rate for
``--minutes`` (pipeline/loadtest/soak.py), samples the RSS of tritonserver, every Python-backend stub and the
engine worker, waits for the runtime to drain, and stops the server (orphans and /dev/shm regions counted).
Prints a table and the verdict; exit 0 when the soak passed, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts


def shm_regions(server_pid: int) -> list[str]:
    """The /dev/shm regions of this server's Python-backend stubs (named on each stub's command line)."""
    import psutil

    names = set()
    for p in psutil.Process(server_pid).children(recursive=True):
        try:
            names.update(a for a in p.cmdline() if a.startswith("triton_python_backend_shm_region"))
        except psutil.NoSuchProcess:
            continue
    return sorted(names)


def leftovers(repo: Path, regions: list[str]) -> dict:
    """Processes that still run from the repository, and which of the server's /dev/shm regions remain."""
    import psutil

    procs = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(repo) in " ".join(p.info["cmdline"] or []):
                procs.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return {"processes": procs, "shm": [n for n in regions if os.path.exists(f"/dev/shm/{n}")]}


def soak_server(model_repo: Path, log_dir: Path):
    from model_repo.generate import default_sys_path
    from pipeline.serve import ServerConfig, TritonServer, free_ports

    http, grpc, metrics = free_ports(3)
    cfg = ServerConfig(model_repository=model_repo, http_port=http, grpc_port=grpc, metrics_port=metrics,
                       log_file=log_dir / "tritonserver.log", ready_timeout_s=300, python_path=default_sys_path())
    return TritonServer(cfg).start()


def run(model_repo: Path, engine: Path, *, minutes: float, overload: float, capacity_requests: int,
        concurrency: int, input_len: str, output_len: str, warmup_s: float | None, log_dir: Path,
        sample_s: float = 5.0) -> dict:
    """Capacity, then the soak; returns the JSON-ready result (per-request records dropped)."""
    from pipeline.loadtest.config import LoadTestConfig
    from pipeline.loadtest.soak import measure_capacity, run_soak

    log_dir.mkdir(parents=True, exist_ok=True)
    server = soak_server(model_repo, log_dir)
    try:
        def cfg() -> LoadTestConfig:
            return LoadTestConfig(url=server.cfg.grpc_url, metrics_url=f"http://127.0.0.1:{server.cfg.metrics_port}"
                                  "/metrics", tokenizer_dir=engine, input_len=input_len, output_len=output_len,
                                  request_timeout_s=120.0, perf_metrics=False)

        cap = measure_capacity(cfg(), concurrency, capacity_requests)
        rate = overload * cap["rps"]
        duration = minutes * 60.0
        warm = warmup_s if warmup_s is not None else max(20.0, min(300.0, duration / 10))
        t = time.monotonic()
        soak = run_soak(cfg(), rate=rate, duration_s=duration, server_pid=server.proc.pid, warmup_s=warm,
                        sample_s=sample_s)
        soak["wall_s"] = round(time.monotonic() - t, 1)
    finally:
        regions = shm_regions(server.proc.pid)
        stop = server.stop()
    time.sleep(1.0)
    left = leftovers(model_repo, regions)
    soak.pop("requests")
    return {"host": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                     "load_average_at_end": os.getloadavg()},
            "model_repo": str(model_repo), "workload": {"input_len": input_len, "output_len": output_len},
            "capacity": {k: cap[k] for k in ("rps", "concurrency")} | {
                "ttft_p50_s": cap["summary"]["ttft_s"]["p50"]},
            "overload": overload, "soak": soak, "stop": stop, "leftovers": left}


def table(res: dict) -> str:
    s, v = res["soak"], res["soak"]["verdict"]
    out = v["by_outcome"]
    lines = [f"capacity {res['capacity']['rps']:.2f} req/s (closed loop, concurrency {res['capacity']['concurrency']});"
             f" soak {s['rate']:.2f} req/s ({res['overload']:g}x) for {s['duration_s'] / 60:g} min, warm-up "
             f"{s['warmup_s']:g} s",
             "", "| outcome | requests |", "|---|---:|"]
    lines += [f"| {k} | {n} |" for k, n in sorted(out.items())]
    lines += [f"| **sent** | **{v['sent']}** |", "", "| process | RSS after warm-up MiB | end MiB | peak MiB | growth |",
              "|---|---:|---:|---:|---:|"]
    for k, g in sorted(s["rss"].items()):
        lines.append(f"| {k} | {g['rss_mib_after_warmup']} | {g['rss_mib_end']} | {g['peak_mib']} | "
                     f"{100 * g['growth']:+.2f}% |")
    d = s["drain"]
    lines += ["", f"drain after the load stopped: {d.get('drain_s')} s to inflight {d.get('inflight')}, KV blocks "
                  f"free {d.get('kv_free')} of {d.get('kv_total')}",
              f"stop: forced {res['stop'].get('forced')}, stubs killed {res['stop'].get('stubs_killed')}; left after "
              f"stop: {len(res['leftovers']['processes'])} processes, {len(res['leftovers']['shm'])} /dev/shm regions",
              f"verdict: {'PASS' if v['passed'] else 'FAIL'}" + ("" if v["passed"] else ": " + "; ".join(v["reasons"]))]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, default=REPO / "build" / "smollm2-135m" / "cpu",
                    help="a built folder (model_repo/ and engine/ inside); default: the embedded default build")
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the open loop sends")
    ap.add_argument("--overload", type=float, default=2.0, help="the open loop's rate over the measured capacity")
    ap.add_argument("--capacity-requests", type=int, default=48, help="requests of the closed-loop capacity run")
    ap.add_argument("--concurrency", type=int, default=8, help="closed-loop concurrency (the build's max_batch_size)")
    ap.add_argument("--input-len", default="128", help="synthetic input tokens per request")
    ap.add_argument("--output-len", default="32", help="max_tokens per request")
    ap.add_argument("--warmup-s", type=float, default=None, help="seconds before the RSS baseline (default 10%%)")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    args = ap.parse_args(argv)
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"trtpipe-soak-{os.getpid()}"
    res = run(args.build_dir / "model_repo", args.build_dir / "engine", minutes=args.minutes, overload=args.overload,
              capacity_requests=args.capacity_requests, concurrency=args.concurrency, input_len=args.input_len,
              output_len=args.output_len, warmup_s=args.warmup_s, log_dir=logs)
    res["command"] = "python scripts/bench/bench_soak.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["soak"]["verdict"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
