"""Triton's Prometheus endpoint: snapshots before/after a run and a sampled time series during it.

The "before" snapshot is taken when the warm-up requests have finished (``Sampler.mark``), so the
counter deltas cover the measured requests only.

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


def settled(url: str, quiet_s: float = 0.25, timeout_s: float = 3.0) -> dict | None:
    """A snapshot taken once the COUNTERS stopped moving (two scrapes ``quiet_s`` apart agree), or the
    last one after ``timeout_s``. Triton counts a decoupled request when it is released, which can come
    a moment after the client saw its final response, and the pytorch runtime publishes its
    trtpipe_runtime_* counters every cancellation_check_period_ms (100 ms by default), so a snapshot
    taken at once may miss the last requests."""
    def counters(snap: dict | None) -> dict:
        return {k: v for k, v in (snap or {}).items() if k[0] in COUNTERS}

    snap, deadline = scrape(url), time.monotonic() + timeout_s
    while snap is not None and time.monotonic() < deadline:
        time.sleep(quiet_s)
        again = scrape(url)
        if again is None or counters(again) == counters(snap):
            return again if again is not None else snap
        snap = again
    return snap


def _key(name: str, labels: tuple) -> str:
    return name + ("{" + ",".join(f"{k}={v}" for k, v in labels if k != "version") + "}" if labels else "")


def deltas(before: dict | None, after: dict | None) -> dict:
    """Counter increases over the run, for the counters listed in COUNTERS."""
    if not before or not after:
        return {}
    return {_key(*k): after[k] - before.get(k, 0.0) for k in sorted(after) if k[0] in COUNTERS
            and after[k] - before.get(k, 0.0) != 0}


SAMPLED = ("trtpipe_runtime_requests", "trtpipe_runtime_kv_cache_blocks")
"""The portable runtime's gauges sampled during a run: requests by state, KV-cache blocks free and total."""


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
                row.update({_key(n, lab): v for (n, lab), v in snap.items() if n in SAMPLED})
                self.series.append(row)

    def __enter__(self) -> "Sampler":
        if self.url:
            self.before = settled(self.url)
            self._thread.start()
        return self

    def mark(self) -> None:
        """Take the counters' starting snapshot again (called when the warm-up requests are done, so
        the deltas count the measured requests only)."""
        if self.url:
            self.before = settled(self.url)

    def __exit__(self, *exc) -> None:
        if self.url:
            self._stop.set()
            self._thread.join(timeout=5)
            self.after = settled(self.url)

    def report(self, t0: float) -> dict:
        return {"url": self.url, "available": self.before is not None,
                "counter_window": "measured requests (from the end of the warm-up)",
                "counter_deltas": deltas(self.before, self.after),
                "runtime_gauges": [{**r, "t": round(r.pop("t_mono") - t0, 3)} for r in
                                   (dict(x) for x in self.series)]}
