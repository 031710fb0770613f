"""What the OpenAI frontend costs: the same load through it and straight to Triton's gRPC ensemble, one server.

Starts the trivial streaming model (no model compute: one " tok" token every ``--token-delay-us``), then the
frontend in front of it (``--triton-model ensemble``, the SmolLM2 tokenizer for prompt counting), and runs
`trtpipe loadtest` closed-loop at each concurrency over gRPC (``--endpoint triton``) and over
``/v1/completions`` (``--endpoint openai-completions``), interleaved per point. Then an open-loop rate sweep
through the frontend for the highest request rate it sustains (as `trtpipe loadtest selfcheck` judges it: the
client valid, no error, completions keeping pace with the schedule). Prints markdown tables; ``--json`` keeps the numbers.

    .venv/bin/python scripts/bench/bench_openai_frontend.py --concurrency 1,16 --rates 25,50,100,200 \
        --json docs/benchmarks/openai_frontend.json

On a GPU host without the project's venv (scripts/bench/h200_session.sh, PLAN=p23): ``--tokenizer`` the SmolLM2
tokenizer folder, ``--python-path`` the stub's site-packages (numpy<2 first, as bench_h200.py's), ``--rates ""``
for the closed loop alone.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

from pipeline.loadtest.api import run_loadtest  # noqa: E402
from pipeline.loadtest.config import LoadTestConfig  # noqa: E402
from pipeline.loadtest.selfcheck import trivial_server  # noqa: E402
from pipeline.launch_config import FrontendLaunch  # noqa: E402
from pipeline.serve import OpenAIFrontend, free_ports  # noqa: E402


def point(cfg: LoadTestConfig) -> dict:
    rep = run_loadtest(cfg)
    p = rep["points"][0]
    s = p["summary"]
    sched = [r["scheduled"] for r in p["requests"] if not r["warmup"]]
    span = max(sched) - min(sched) if sched else 0.0
    return {"req_s": s["request_throughput"], "tok_s": s["output_token_throughput"],
            "kept_pace": (s["duration_s"] or 1e9) <= 1.1 * span + 0.1,
            "ttft_p50_ms": s["ttft_s"]["p50"] * 1e3, "ttft_p99_ms": s["ttft_s"]["p99"] * 1e3,
            "itl_p50_ms": (s["itl_s_pooled"]["p50"] or 0) * 1e3, "failed": s["requests"]["failed"],
            "valid": p["validity"]["valid"], "reasons": p["validity"]["reasons"],
            "lag_p95_ms": (s.get("schedule_lag_s", {}).get("p95") or 0) * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rates", default="25,50,100,200")
    ap.add_argument("--num-requests", type=int, default=400)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--token-delay-us", type=int, default=1000)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tokenizer", type=Path, default=None, help="SmolLM2 tokenizer folder (default: the embedded one)")
    ap.add_argument("--python-path", default="", help="the stub's site-packages (default: this interpreter's)")
    args = ap.parse_args()
    if args.tokenizer is None:
        from tests.conftest import smollm2_tokenizer_dir

        tok = smollm2_tokenizer_dir()
    else:
        tok = args.tokenizer
    stub_path = [x for x in args.python_path.split(":") if x]
    if stub_path:  # the trivial server's stub gets these (TRTPIPE_PYTHONPATH), as bench_h200.py --python-path
        import model_repo.generate as generate

        generate.default_sys_path = lambda: list(stub_path)
    import os

    out: dict = {"host": {"platform": platform.platform(), "python": platform.python_version(),
                          "cpus": os.cpu_count()},
                 "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                 "closed": [], "open": []}
    with tempfile.TemporaryDirectory() as tmp, trivial_server(Path(tmp), token_delay_us=args.token_delay_us) as (
            grpc, metrics):
        port = free_ports(1)[0]
        fe = OpenAIFrontend(FrontendLaunch(grpc, "trivial", tok, 4096, 8192, True, port=port,
                                           log_file=Path(tmp) / "fe.log", triton_model="ensemble")).start()
        base = fe.launch.url + "/v1"
        common = dict(input_len="16", output_len=str(args.output_len), warmup=8, perf_metrics=False,
                      tokenizer_dir=tok, fixed_output="none")
        try:
            for c in [int(x) for x in args.concurrency.split(",")]:
                row = {"concurrency": c}
                for name, url, endpoint in (("grpc", grpc, "triton"), ("openai", base, "openai-completions")):
                    row[name] = point(LoadTestConfig(url=url, endpoint=endpoint, mode="closed", concurrency=[c],
                                                     num_requests=args.num_requests, **common))
                out["closed"].append(row)
                g, o = row["grpc"], row["openai"]
                print(f"c={c}: grpc {g['req_s']:.1f} req/s TTFT p50 {g['ttft_p50_ms']:.2f} ms | openai "
                      f"{o['req_s']:.1f} req/s TTFT p50 {o['ttft_p50_ms']:.2f} ms", flush=True)
            for r in [float(x) for x in args.rates.split(",") if x]:
                n = max(100, int(r * 4))
                res = point(LoadTestConfig(url=base, endpoint="openai-completions", mode="open", rate=[r],
                                           num_requests=n, **common))
                res["rate"] = r
                # as `trtpipe loadtest selfcheck` judges it: valid, no error, completions kept pace with the
                # schedule's own span (a short Poisson schedule's realised rate is not the nominal one)
                res["sustained"] = res["valid"] and res["failed"] == 0 and res["kept_pace"]
                out["open"].append(res)
                print(f"rate {r:g}: achieved {res['req_s']:.1f} req/s, TTFT p50 {res['ttft_p50_ms']:.1f} ms, "
                      f"sustained {res['sustained']}", flush=True)
        finally:
            fe.stop(10)
    print("\n| concurrency | gRPC req/s | OpenAI req/s | throughput cost | gRPC TTFT p50 ms | OpenAI TTFT p50 ms | "
          "TTFT cost ms | gRPC ITL p50 ms | OpenAI ITL p50 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in out["closed"]:
        g, o = row["grpc"], row["openai"]
        print(f"| {row['concurrency']} | {g['req_s']:.1f} | {o['req_s']:.1f} | "
              f"{100 * (1 - o['req_s'] / g['req_s']):.1f}% | {g['ttft_p50_ms']:.2f} | {o['ttft_p50_ms']:.2f} | "
              f"{o['ttft_p50_ms'] - g['ttft_p50_ms']:.2f} | {g['itl_p50_ms']:.2f} | {o['itl_p50_ms']:.2f} |")
    print("\n| offered req/s | achieved req/s | TTFT p50 ms | TTFT p99 ms | client lag p95 ms | sustained |")
    print("|---|---|---|---|---|---|")
    for r in out["open"]:
        print(f"| {r['rate']:g} | {r['req_s']:.1f} | {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | "
              f"{r['lag_p95_ms']:.1f} | {'yes' if r['sustained'] else 'no: ' + '; '.join(r['reasons']) or 'no'} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
