"""An overload soak: an open loop at a multiple of the server's measured capacity for a long time, and the
verdict an SRE asks for before putting a deployment in front of users.

``measure_capacity`` runs a closed loop at the batch size and returns the completed requests/s; ``run_soak``
sends a Poisson open loop at ``rate`` for ``duration_s`` while ``ProcessWatch`` samples the resident memory of
tritonserver and every process under it (Python-backend stubs, the engine worker), then stops sending and
waits for the runtime to drain. The verdict (``judge``) passes when every request completed or was refused at
once as overloaded (``runner.OVERLOAD_WORDS``), none timed out, failed otherwise or was never sent; no process
grew more than ``max_rss_growth`` between the end of the warm-up and the end of the run; the client kept to
its schedule; and every KV-cache
block was free again after the drain (``trtpipe_runtime_kv_cache_blocks``).
"""

from __future__ import annotations

import math
import statistics
import threading
import time

from pipeline.loadtest.api import _inputs, check_server, run_point
from pipeline.loadtest.config import LoadTestConfig
from pipeline.loadtest.server_metrics import scrape
from pipeline.loadtest.workload import load_tokenizer

ALLOWED_ERRORS = ("overloaded",)
"""Error kinds an overload soak accepts: an immediate, named refusal the client can retry."""


class ProcessWatch:
    """Samples the RSS (bytes) of a process and all its descendants every ``interval_s`` in a thread.

    ``series`` maps "name pid" -> [(seconds since start, rss bytes), ...]; a process that exits keeps its
    samples and gets no more.
    """

    def __init__(self, pid: int, interval_s: float = 5.0):
        self.pid, self.interval = pid, interval_s
        self.series: dict[str, list[tuple[float, int]]] = {}
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @staticmethod
    def _name(proc) -> str:
        cmd = proc.cmdline()
        for part in cmd:  # a stub names its model.py; the worker its engine_worker.py
            if part.endswith(("model.py", "engine_worker.py")):
                return "/".join(part.split("/")[-3:-2] + part.split("/")[-1:])
        return proc.name()

    def sample(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        now = time.monotonic() - self.t0
        for proc in procs:
            try:
                key = f"{self._name(proc)} {proc.pid}"
                self.series.setdefault(key, []).append((round(now, 1), proc.memory_info().rss))
            except psutil.NoSuchProcess:
                continue

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> "ProcessWatch":
        self.t0 = time.monotonic()
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def growth(self, warmup_s: float) -> dict[str, dict]:
        """Per process: median RSS of the first samples after ``warmup_s`` and of the last ones (5 each, or
        the fifth of the samples when fewer), in MiB, and the growth between them as a fraction."""
        out = {}
        for key, points in self.series.items():
            after = [rss for t, rss in points if t >= warmup_s]
            if len(after) < 2:
                continue
            k = max(1, min(5, len(after) // 5))
            start, end = statistics.median(after[:k]), statistics.median(after[-k:])
            out[key] = {"rss_mib_after_warmup": round(start / 2**20, 1), "rss_mib_end": round(end / 2**20, 1),
                        "peak_mib": round(max(after) / 2**20, 1), "growth": (end - start) / start, "samples": len(after)}
        return out


def _gauge(snap: dict | None, family: str, state: str) -> float | None:
    if not snap:
        return None
    for (name, labels), value in snap.items():
        if name == family and ("state", state) in labels:
            return value
    return None


def wait_drained(metrics_url: str, timeout_s: float = 120.0) -> dict:
    """After the load stops: poll the runtime's gauges until nothing is in flight and every KV block is free.

    Returns {"drain_s", "inflight", "kv_free", "kv_total"} as last read (``drain_s`` None when it did not
    drain within ``timeout_s``)."""
    t0 = time.monotonic()
    last: dict = {}
    while True:
        snap = scrape(metrics_url)
        last = {"inflight": _gauge(snap, "trtpipe_runtime_requests", "inflight"),
                "kv_free": _gauge(snap, "trtpipe_runtime_kv_cache_blocks", "free"),
                "kv_total": _gauge(snap, "trtpipe_runtime_kv_cache_blocks", "total")}
        if last["inflight"] == 0 and last["kv_free"] is not None and last["kv_free"] == last["kv_total"]:
            return {"drain_s": round(time.monotonic() - t0, 2), **last}
        if time.monotonic() - t0 > timeout_s:
            return {"drain_s": None, **last}
        time.sleep(0.5)


def measure_capacity(cfg: LoadTestConfig, concurrency: int, num_requests: int) -> dict:
    """Closed loop at ``concurrency`` for ``num_requests``: {"rps": completed requests/s from the first send to
    the last answer, "summary": ...}.

    Raises LoadTestError when the server or model cannot be driven (api.check_server)."""
    meta = check_server(cfg)
    tok = load_tokenizer(cfg.tokenizer_dir)
    cfg.num_requests = num_requests
    point = run_point(cfg, {"mode": "closed", "concurrency": concurrency}, 0, tok,
                      _inputs(cfg, meta, getattr(tok, "vocab_size", None)))
    s = point["summary"]
    rps = s["request_throughput"]
    return {"rps": rps, "concurrency": concurrency, "summary": s,
            "validity": point["validity"]}


def run_soak(cfg: LoadTestConfig, *, rate: float, duration_s: float, server_pid: int, warmup_s: float,
             sample_s: float = 5.0) -> dict:
    """Open loop (Poisson) at ``rate`` requests/s for ``duration_s`` seconds, RSS sampled every ``sample_s``;
    then the drain. Returns {"rate", "duration_s", "summary", "client", "rss", "drain", "verdict"}."""
    meta = check_server(cfg)
    tok = load_tokenizer(cfg.tokenizer_dir)
    cfg.duration_s = duration_s
    cfg.num_requests = int(math.ceil(rate * duration_s * 1.5)) + 8  # the duration ends the point, not the count
    cfg.drain_timeout_s = max(cfg.drain_timeout_s, 60.0)
    with ProcessWatch(server_pid, sample_s) as watch:
        point = run_point(cfg, {"mode": "open", "rate": rate}, 0, tok,
                          _inputs(cfg, meta, getattr(tok, "vocab_size", None)))
        drain = wait_drained(cfg.metrics_url) if cfg.metrics_url else {"drain_s": None}
    result = {"rate": rate, "duration_s": duration_s, "warmup_s": warmup_s, "summary": point["summary"],
              "client": point["client"], "rss": watch.growth(warmup_s), "drain": drain,
              "requests": point["requests"]}
    result["verdict"] = judge(result)
    return result


def judge(result: dict, max_rss_growth: float = 0.05, max_schedule_lag_s: float = 0.25) -> dict:
    """The soak's verdict from ``run_soak``'s result: {"passed", "reasons", "by_outcome"}."""
    reqs = [r for r in result["requests"] if not r.get("warmup")]
    by_outcome: dict[str, int] = {}
    for r in reqs:
        kind = r.get("error_kind") or "completed"
        by_outcome[kind] = by_outcome.get(kind, 0) + 1
    reasons = []
    bad = {k: n for k, n in by_outcome.items() if k not in ("completed",) + ALLOWED_ERRORS}
    if bad:
        reasons.append("requests neither completed nor refused as overloaded: "
                       + ", ".join(f"{k} {n}" for k, n in sorted(bad.items())))
    lag = result["summary"].get("schedule_lag_s", {}).get("p95")
    if lag is not None and lag > max_schedule_lag_s:
        reasons.append(f"the client fell behind its schedule (p95 lag {lag:.3f} s > {max_schedule_lag_s} s): "
                       "the rate sent was not the rate asked")
    if not by_outcome.get("completed"):
        reasons.append("no request completed")
    grown = {k: g for k, g in result["rss"].items() if g["growth"] > max_rss_growth}
    if grown:
        reasons.append("RSS grew after warm-up: " + ", ".join(f"{k} {100 * g['growth']:+.1f}%"
                                                             for k, g in grown.items()))
    if not result["rss"]:
        reasons.append("no RSS samples after the warm-up (run longer than warmup_s)")
    d = result["drain"]
    if d.get("drain_s") is None:
        reasons.append(f"the runtime did not drain after the load stopped (inflight {d.get('inflight')}, "
                       f"KV blocks free {d.get('kv_free')} of {d.get('kv_total')})")
    return {"passed": not reasons, "reasons": reasons, "by_outcome": by_outcome, "sent": len(reqs),
            "max_rss_growth": max_rss_growth}
