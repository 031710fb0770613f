"""Side by side: `trtpipe loadtest` vs aiperf on the same local server and workload.

Starts the trivial streaming model (no compute, so the clients are what is measured), then
for each request rate runs our open-loop Poisson load over gRPC and aiperf (its own venv)
over Triton's HTTP /v2/models/ensemble/generate_stream SSE endpoint with the same request
count, output length and arrival pattern. Prints a markdown table: TTFT p50, request and
output-token throughput from both, and whether each client kept up with the offered rate.

    .venv/bin/python scripts/bench/bench_loadtest_vs_aiperf.py --aiperf AIPERF_VENV/bin/aiperf \
        --rates 10,40,160 --seconds 4 --output-len 16

``--openai``: both on the OpenAI frontend's ``/v1/completions`` in front of the same trivial model (ours with
``--endpoint openai-completions``, aiperf with ``--endpoint-type completions``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from plugins.procenv import passive_openmp  # noqa: E402

passive_openmp()  # before torch starts

from pipeline.loadtest.api import run_loadtest  # noqa: E402
from pipeline.loadtest.config import LoadTestConfig  # noqa: E402
from pipeline.loadtest.selfcheck import trivial_server  # noqa: E402

TEMPLATE = '{"text_input": {{ text|tojson }}, "max_tokens": {{ max_tokens }}, "stream": true}'


def ours(url: str, rate: float, n: int, out_len: int) -> dict:
    rep = run_loadtest(LoadTestConfig(url=url, mode="open", rate=[rate], num_requests=n, input_len="16",
                                      output_len=str(out_len), warmup=4, perf_metrics=False))
    s, p = rep["points"][0]["summary"], rep["points"][0]
    return {"ttft_p50_ms": s["ttft_s"]["p50"] * 1e3, "req_s": s["request_throughput"],
            "tok_s": s["output_token_throughput"], "failed": s["requests"]["failed"],
            "valid": p["validity"]["valid"], "lag_p95_ms": s["schedule_lag_s"]["p95"] * 1e3}


def _stat(d: dict, *names, q="avg"):
    for n in names:
        if n in d and isinstance(d[n], dict):
            return d[n].get(q, d[n].get("avg"))
    return None


def _run_aiperf(cmd: list[str], art: Path) -> dict:
    """Run one aiperf profile; its TTFT/ITL p50, request and output-token throughput, errors, wall time."""
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    found = list(art.rglob("profile_export_aiperf.json"))
    if proc.returncode != 0 or not found:
        return {"error": (proc.stderr or proc.stdout)[-800:], "wall_s": time.monotonic() - t}
    d = json.loads(found[0].read_text())
    d = d.get("records", d)
    return {"ttft_p50_ms": _stat(d, "time_to_first_token", "ttft", q="p50"),
            "itl_p50_ms": _stat(d, "inter_token_latency", q="p50"), "req_s": _stat(d, "request_throughput"),
            "tok_s": _stat(d, "output_token_throughput"), "failed": _stat(d, "error_request_count") or 0,
            "wall_s": time.monotonic() - t}


def aiperf(binary: str, http_url: str, rate: float, n: int, out_len: int, tokenizer: str, work: Path) -> dict:
    art = work / f"aiperf-{rate:g}"
    cmd = [binary, "profile", "--model", "ensemble", "--url", f"http://{http_url}", "--endpoint-type", "template",
           "--custom-endpoint", "/v2/models/ensemble/generate_stream", "--streaming",
           "--extra-inputs", json.dumps({"payload_template": TEMPLATE, "response_field": "text_output"}),
           "--tokenizer", tokenizer, "--request-rate", str(rate), "--arrival-pattern", "poisson",
           "--request-count", str(n), "--warmup-request-count", "4",
           "--prompt-input-tokens-mean", "16", "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(out_len), "--prompt-output-tokens-stddev", "0",
           "--ui-type", "none", "--output-artifact-dir", str(art), "--random-seed", "0"]
    return _run_aiperf(cmd, art)


def ours_openai(base_url: str, rate: float, n: int, out_len: int, tokenizer: str) -> dict:
    rep = run_loadtest(LoadTestConfig(url=base_url, endpoint="openai-completions", mode="open", rate=[rate],
                                      num_requests=n, input_len="16", output_len=str(out_len), warmup=4,
                                      tokenizer_dir=Path(tokenizer)))
    s, p = rep["points"][0]["summary"], rep["points"][0]
    return {"ttft_p50_ms": s["ttft_s"]["p50"] * 1e3, "itl_p50_ms": (s["itl_s_pooled"]["p50"] or 0) * 1e3,
            "req_s": s["request_throughput"], "tok_s": s["output_token_throughput"],
            "failed": s["requests"]["failed"], "valid": p["validity"]["valid"],
            "lag_p95_ms": s["schedule_lag_s"]["p95"] * 1e3}


def aiperf_openai(binary: str, base_url: str, model: str, rate: float, n: int, out_len: int, tokenizer: str,
                  work: Path) -> dict:
    """aiperf on the same OpenAI /v1/completions endpoint, workload and arrival pattern."""
    art = work / f"aiperf-openai-{rate:g}"
    cmd = [binary, "profile", "--model", model, "--url", base_url.rsplit("/v1", 1)[0], "--endpoint-type",
           "completions", "--streaming", "--tokenizer", tokenizer, "--request-rate", str(rate),
           "--arrival-pattern", "poisson", "--request-count", str(n), "--warmup-request-count", "4",
           "--prompt-input-tokens-mean", "16", "--prompt-input-tokens-stddev", "0",
           "--prompt-output-tokens-mean", str(out_len), "--prompt-output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0", "--ui-type", "none", "--output-artifact-dir", str(art),
           "--random-seed", "0"]
    return _run_aiperf(cmd, art)


def main_openai(args) -> int:
    """--openai: both clients on the OpenAI frontend's /v1/completions in front of the trivial model."""
    from pipeline.launch_config import FrontendLaunch
    from pipeline.serve import OpenAIFrontend, free_ports

    rows = []
    with tempfile.TemporaryDirectory() as tmp, trivial_server(Path(tmp)) as (grpc_url, _metrics):
        fe = OpenAIFrontend(FrontendLaunch(grpc_url, "trivial", Path(args.tokenizer), 4096, 8192, True,
                                           port=free_ports(1)[0], log_file=Path(tmp) / "fe.log",
                                           triton_model="ensemble")).start()
        base = fe.launch.url + "/v1"
        try:
            for rate in (float(r) for r in args.rates.split(",")):
                n = int(max(20, min(rate * args.seconds, 400)))
                a = ours_openai(base, rate, n, args.output_len, args.tokenizer)
                b = aiperf_openai(args.aiperf, base, "trivial", rate, n, args.output_len, args.tokenizer, Path(tmp))
                rows.append({"rate": rate, "n": n, "trtpipe": a, "aiperf": b})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            fe.stop(10)
    _table(rows, [("TTFT p50 ms", "ttft_p50_ms", 2), ("ITL p50 ms", "itl_p50_ms", 2), ("req/s", "req_s", 1),
                  ("out tok/s", "tok_s", 1)], args.json)
    return 0


def _table(rows: list[dict], cols: list[tuple[str, str, int]], json_path: Path | None, valid: bool = False) -> None:
    """Print the side-by-side markdown table (each column for trtpipe, then aiperf) and write the rows."""
    f = lambda x, nd=1: "-" if x is None else f"{x:.{nd}f}"  # noqa: E731
    heads = [f"{who} {name}" for name, _, _ in cols for who in ("trtpipe", "aiperf")]
    heads += ["trtpipe valid (lag p95 ms)"] if valid else []
    print("\n| rate req/s | n | " + " | ".join(heads) + " |")
    print("|" + "---|" * (2 + len(heads)))
    for r in rows:
        a, b = r["trtpipe"], r["aiperf"]
        cells = [f(side.get(key), nd) for _, key, nd in cols for side in (a, b)]
        cells += [f"{a['valid']} ({f(a['lag_p95_ms'], 2)})"] if valid else []
        print(f"| {r['rate']:g} | {r['n']} | " + " | ".join(cells) + " |")
    if json_path:
        json_path.write_text(json.dumps(rows, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aiperf", default="aiperf", help="the aiperf executable (installed in a venv of its own)")
    ap.add_argument("--rates", default="10,40,160")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--tokenizer", default=str(Path(__file__).resolve().parents[2] / "build" / "smollm2-135m" / "cpu" / "engine"),
                    help="for aiperf's token counting (the trivial model sends ' tok' = 1 token per response)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--openai", action="store_true", help="both clients on the OpenAI frontend's /v1/completions "
                    "(in front of the trivial model) instead of Triton's own endpoints")
    args = ap.parse_args()
    if args.openai:
        return main_openai(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, trivial_server(Path(tmp)) as (grpc_url, _metrics):
        http_url = grpc_url.rsplit(":", 1)[0] + ":" + _http_port(Path(tmp))
        for rate in (float(r) for r in args.rates.split(",")):
            n = int(max(20, min(rate * args.seconds, 400)))
            a = ours(grpc_url, rate, n, args.output_len)
            b = aiperf(args.aiperf, http_url, rate, n, args.output_len, args.tokenizer, Path(tmp))
            rows.append({"rate": rate, "n": n, "trtpipe": a, "aiperf": b})
            print(json.dumps(rows[-1]), flush=True)
    _table(rows, [("TTFT p50 ms", "ttft_p50_ms", 2), ("req/s", "req_s", 1), ("out tok/s", "tok_s", 1)], args.json,
           valid=True)
    return 0


def _http_port(tmp: Path) -> str:
    log = next(tmp.rglob("tritonserver-*.log"))
    for line in log.read_text().splitlines():
        if "Started HTTPService at" in line:
            return line.rsplit(":", 1)[1].strip().strip('"')
    raise RuntimeError(f"no HTTP port in {log}")


if __name__ == "__main__":
    sys.exit(main())
