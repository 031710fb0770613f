"""Triton's Prometheus endpoint: snapshots before/after a run and a sampled time series during it.

Reported beside the client's numbers: deltas of Triton's ``nv_inference_*`` counters per
model (requests, failures, queue and compute time) and the runtime's
``trtpipe_runtime_requests{state=...}`` gauges sampled every ``interval_s``.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+([-+0-9.eEinfNa]+)')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
            "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us", "trtpipe_runtime_total",
            "trtpipe_runtime_response_seconds_total")


def parse(text: str) -> dict[tuple[str, tuple], float]:
    """Prometheus text -> {(name, sorted label pairs): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = LINE.match(line)
        if m:
            labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
            try:
                out[(m.group(1), labels)] = float(m.group(3))
            except ValueError:
                continue
    return out


def scrape(url: str, timeout: float = 2.0) -> dict | None:
    """One snapshot, or None when the endpoint does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return parse(resp.read().decode(errors="replace"))
    except OSError:
        return None


def _key(name: str, labels: tuple) -> str:
    return name + ("{" + ",".join(f"{k}={v}" for k, v in labels if k != "version") + "}" if labels else "")


def deltas(before: dict | None, after: dict | None) -> dict:
    """Counter increases over the run, for the counters listed in COUNTERS."""
    if not before or not after:
        return {}
    return {_key(*k): after[k] - before.get(k, 0.0) for k in sorted(after) if k[0] in COUNTERS
            and after[k] - before.get(k, 0.0) != 0}


class Sampler:
    """Samples the runtime's gauges in a background thread while a run goes on."""

    def __init__(self, url: str | None, interval_s: float = 0.5):
        self.url, self.interval = url, interval_s
        self.series: list[dict] = []
        self.before = self.after = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            snap = scrape(self.url)
            if snap:
                row = {"t_mono": time.monotonic()}
                row.update({_key(n, lab): v for (n, lab), v in snap.items() if n == "trtpipe_runtime_requests"})
                self.series.append(row)

    def __enter__(self) -> "Sampler":
        if self.url:
            self.before = scrape(self.url)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.url:
            self._stop.set()
            self._thread.join(timeout=5)
            self.after = scrape(self.url)

    def report(self, t0: float) -> dict:
        return {"url": self.url, "available": self.before is not None,
                "counter_deltas": deltas(self.before, self.after),
                "runtime_gauges": [{**r, "t": round(r.pop("t_mono") - t0, 3)} for r in
                                   (dict(x) for x in self.series)]}
