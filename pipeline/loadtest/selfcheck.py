"""The client's own ceiling: open-loop rates against the trivial streaming model.

No model compute happens on the server, so whatever limits throughput here is Triton's
Python-backend overhead plus this client. The highest rate the client sustains (every request
sent, none failed, p95 schedule lag within bound, client CPU not saturated, and the last
completion within 10% of the schedule's span)
is its ceiling; ``trtpipe loadtest run --ceiling selfcheck.json`` refuses to call points
above it valid.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import tempfile
from pathlib import Path
from typing import Iterator

from pipeline.loadtest.api import run_loadtest
from pipeline.loadtest.config import LoadTestConfig

log = logging.getLogger("trtpipe")
DEFAULT_RATES = (25.0, 50.0, 100.0, 200.0, 400.0)


@contextlib.contextmanager
def serve_repository(repo: Path, ready_timeout_s: float = 600.0, log_dir: Path | None = None,
                     frontend_for=None) -> Iterator[tuple[str, ...]]:
    """Start tritonserver on ``repo`` on free ports; yield (gRPC url, metrics url); always stop it. With
    ``frontend_for`` (the build), the OpenAI frontend too, and its base URL (``http://host:port/v1``) third.

    The logs go to ``log_dir`` (default: the temp folder), never into the repository's build folder.
    """
    from model_repo.generate import default_sys_path
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, ServerConfig, TritonServer, free_ports

    http, grpc, metrics, openai = free_ports(4)
    logs = Path(log_dir or tempfile.gettempdir())
    cfg = ServerConfig(Path(repo), http, grpc, metrics, python_path=default_sys_path(),
                       log_file=logs / f"tritonserver-{grpc}.log", ready_timeout_s=ready_timeout_s)
    server = TritonServer(cfg).start()
    frontend = None
    try:
        if frontend_for is not None:
            launch = frontend_launch(frontend_for, cfg, openai, Path(repo).parent / "engine")
            launch.log_file = logs / f"openai_frontend-{openai}.log"
            frontend = OpenAIFrontend(launch).start()
            yield cfg.grpc_url, f"http://{cfg.address}:{metrics}/metrics", launch.url + "/v1"
        else:
            yield cfg.grpc_url, f"http://{cfg.address}:{metrics}/metrics"
    finally:
        if frontend is not None:
            frontend.stop(10)
        server.stop()


@contextlib.contextmanager
def trivial_server(work_dir: Path | None = None, token_delay_us: int = 0) -> Iterator[tuple[str, str]]:
    """A server on a freshly written trivial-stream repository."""
    from model_repo.trivial import write_trivial_repository

    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        repo = write_trivial_repository(Path(tmp) / "model_repo", token_delay_us=token_delay_us)
        with serve_repository(repo, ready_timeout_s=120, log_dir=Path(tmp)) as urls:
            yield urls


def selfcheck(rates=DEFAULT_RATES, *, output_len: int = 16, seconds_per_rate: float = 3.0, client_procs: int = 1,
              connections: int = 1, url: str | None = None, metrics_url: str | None = None,
              min_requests: int = 20, max_requests: int = 400) -> dict:
    """Escalate the rate until the client stops keeping up; returns the table and the ceiling."""
    with contextlib.ExitStack() as stack:
        if url is None:
            url, metrics_url = stack.enter_context(trivial_server())
        rows, ceiling = [], None
        for rate in rates:
            n = int(min(max(rate * seconds_per_rate, min_requests), max_requests))
            cfg = LoadTestConfig(url=url, metrics_url=metrics_url, mode="open", rate=[rate], num_requests=n,
                                 input_len="8", output_len=str(output_len), client_procs=client_procs,
                                 connections=connections, warmup=4, duration_s=seconds_per_rate * 3,
                                 request_timeout_s=30, drain_timeout_s=10)
            rep = run_loadtest(cfg)
            p = rep["points"][0]
            s = p["summary"]
            achieved = s["request_throughput"] or 0.0
            # Kept up: every request sent on time (validity: lag, CPU) and completions kept pace with the
            # schedule's own span (a short Poisson schedule's realised rate differs from the nominal one).
            sched = [r["scheduled"] for r in p["requests"] if not r["warmup"]]
            span = max(sched) - min(sched) if sched else 0.0
            kept_up = (p["validity"]["valid"] and not s["requests"]["failed"] and not p["client"][0]["not_sent"]
                       and (s["duration_s"] or math.inf) <= 1.1 * span + 0.1)
            rows.append({"rate": rate, "requests": n, "achieved_rps": achieved, "schedule_span_s": span,
                         "responses_per_s": (s["output_tokens"] / s["duration_s"]) if s["duration_s"] else None,
                         "schedule_lag_p95_s": s["schedule_lag_s"]["p95"], "ttft_p50_s": s["ttft_s"]["p50"],
                         "client_cpu": max(c["cpu_util"] for c in p["client"]),
                         "failed": s["requests"]["failed"], "kept_up": kept_up,
                         "reasons": p["validity"]["reasons"]})
            log.info("selfcheck rate %g: achieved %.1f req/s, lag p95 %.1f ms, client cpu %.0f%% -> %s", rate,
                     achieved, (s["schedule_lag_s"]["p95"] or 0) * 1e3, rows[-1]["client_cpu"] * 100,
                     "kept up" if kept_up else "fell behind")
            if not kept_up:
                break
            ceiling = rate
    return {"tool": "trtpipe loadtest selfcheck", "output_len": output_len, "client_procs": client_procs,
            "connections": connections, "rows": rows, "ceiling_rps": ceiling}


def load_ceiling(path: Path) -> float | None:
    data = json.loads(Path(path).read_text())
    return data.get("ceiling_rps")
