"""Per-request timings -> summaries, as genai-perf (triton-inference-server/perf_analyzer, genai-perf/README.md
"Metrics") and vLLM's benchmark_serving.py define them.

Times are seconds on the client's monotonic clock. For each request:
TTFT = first token-carrying response - request start; E2E = last response - request start;
TPOT = (E2E - TTFT) / (output tokens - 1) when it produced more than one token, in more than one response;
ITL = gaps between consecutive token-carrying responses, pooled over requests (labelled separately from
TPOT). "Request start" is the actual send; the ``*_sched`` variants start at the scheduled
send time (open loop; coordinated omission) and ``schedule_lag`` is their difference.
Output tokens come from the server's ``num_output_tokens``, never from re-tokenizing.
Throughput counts completed requests over duration = first send to last completion.
Goodput = requests meeting every SLO / duration; every measured request (errors, timeouts,
requests cut by the run's bound) is in the denominator of the goodput fraction.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

PERCENTILES = (50, 90, 95, 99)
P99_MIN_SAMPLES = 100


@dataclass
class RequestRecord:
    """What happened to one request (client monotonic seconds; server times in unix ns)."""

    index: int
    scheduled: float
    sent: float = math.nan
    input_tokens: int = 0
    requested_tokens: int = 0
    response_times: list[float] = field(default_factory=list)
    response_tokens: list[int] = field(default_factory=list)
    done: float = math.nan
    error: str | None = None
    error_kind: str | None = None
    server: dict | None = None
    warmup: bool = False
    text: str | None = None
    """The answer's text, collected only when the run checks answers (a structured-output constraint)."""
    tool_calls: list | None = None
    """OpenAI chat: the answer's tool calls, merged from the stream's deltas (when the run sends tools)."""
    finish_reason: str | None = None
    """OpenAI: the finish_reason of the answer's last chunk (``length``: cut by max_tokens)."""
    check: dict | None = None
    """The answer checked against the run's constraint (pipeline.structured.Verdict.as_dict)."""
    model: str | None = None
    """The model it asked for (``--models``: the base or a LoRA adapter); None: the run's one model."""

    @property
    def ok(self) -> bool:
        return self.error_kind is None and not math.isnan(self.done)

    @property
    def output_tokens(self) -> int:
        return int(sum(self.response_tokens))

    @property
    def token_times(self) -> list[float]:
        return [t for t, n in zip(self.response_times, self.response_tokens) if n > 0]

    @property
    def ttft(self) -> float:
        tt = self.token_times
        return tt[0] - self.sent if tt else math.nan

    @property
    def e2e(self) -> float:
        return (self.response_times[-1] - self.sent) if self.ok and self.response_times else math.nan

    @property
    def tpot(self) -> float:
        """NaN for one output token, and for an answer whose tokens all came in one response (a forced tool call
        through the OpenAI frontend, sent whole at the end): its time per token is not observable."""
        n = self.output_tokens
        return (self.e2e - self.ttft) / (n - 1) if self.ok and n > 1 and len(self.token_times) > 1 else math.nan

    @property
    def itl(self) -> list[float]:
        tt = self.token_times
        return [b - a for a, b in zip(tt, tt[1:])]

    @property
    def schedule_lag(self) -> float:
        return self.sent - self.scheduled

    @property
    def ttft_sched(self) -> float:
        return self.ttft + self.schedule_lag

    @property
    def e2e_sched(self) -> float:
        return self.e2e + self.schedule_lag

    def as_dict(self, t0: float = 0.0) -> dict:
        d = asdict(self)
        for k in ("scheduled", "sent", "done"):
            d[k] = _round(d[k] - t0)
        d["response_times"] = [_round(t - t0) for t in self.response_times]
        d.update(output_tokens=self.output_tokens, ttft=_round(self.ttft), e2e=_round(self.e2e),
                 tpot=_round(self.tpot), schedule_lag=_round(self.schedule_lag))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RequestRecord":
        keys = cls.__dataclass_fields__
        return cls(**{k: (math.nan if v is None and k in ("sent", "done", "scheduled") else v)
                      for k, v in d.items() if k in keys})


def _round(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, 7)


def dist(values) -> dict:
    """mean/min/max and p50/p90/p95/p99, each percentile with its sample count; p99 flagged below 100 samples."""
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    n = int(arr.size)
    out: dict = {"n": n}
    if n == 0:
        out.update({"mean": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}})
        return out
    out.update(mean=float(arr.mean()), min=float(arr.min()), max=float(arr.max()))
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    if n < P99_MIN_SAMPLES:
        out["p99_note"] = f"p99 from {n} samples (< {P99_MIN_SAMPLES}): not reliable"
    return out


@dataclass(frozen=True)
class SLO:
    """Per-request latency objectives in seconds (None = not constrained)."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def met(self, r: RequestRecord) -> bool:
        if not r.ok:
            return False
        for name, lim, value in (("ttft", self.ttft, r.ttft), ("tpot", self.tpot, r.tpot), ("e2e", self.e2e, r.e2e)):
            if lim is None:
                continue
            if math.isnan(value):
                if name == "tpot":  # a one-token output has no TPOT: nothing to miss
                    continue
                return False
            if value > lim:
                return False
        return True

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.ttft, self.tpot, self.e2e))


def steady_window(records: list[RequestRecord], frac: float = 0.1) -> tuple[float, float]:
    """[completion of the first ``frac`` of requests, send of the last ``frac``]: ramp-up and drain excluded.

    Falls back to the middle 80% of the run when that interval is shorter than a fifth of the run (empty, or a sliver
    between a few requests: a handful of tokens over microseconds is no throughput).
    """
    sends = sorted(r.sent for r in records if not math.isnan(r.sent))
    dones = sorted(r.done for r in records if r.ok)
    if not sends or not dones:
        return (math.nan, math.nan)
    k = int(len(sends) * frac)
    start, end = dones[min(k, len(dones) - 1)], sends[max(len(sends) - 1 - k, 0)]
    t0, t1 = sends[0], max(dones[-1], sends[-1])
    if end - start < 0.2 * (t1 - t0):  # empty or a sliver (a few requests): tokens / sliver would be noise
        start, end = t0 + 0.1 * (t1 - t0), t1 - 0.1 * (t1 - t0)
    return (start, end)


def summarize(records: list[RequestRecord], slo: SLO = SLO(), open_loop: bool = False) -> dict:
    """Every figure of one run (warm-up records are ignored)."""
    recs = [r for r in records if not r.warmup]
    sent = [r for r in recs if not math.isnan(r.sent)]
    ok = [r for r in recs if r.ok]
    errors: dict[str, int] = {}
    for r in recs:
        if r.error_kind:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
    t_first = min((r.sent for r in sent), default=math.nan)
    t_last = max((r.done for r in ok), default=math.nan)
    duration = t_last - t_first if ok else math.nan
    out_tokens = sum(r.output_tokens for r in ok)
    good = sum(1 for r in recs if slo.met(r)) if slo.given else len(ok)
    w0, w1 = steady_window(recs)
    win = w1 - w0
    win_tokens = sum(n for r in ok for t, n in zip(r.response_times, r.response_tokens) if w0 <= t <= w1)
    win_done = sum(1 for r in ok if w0 <= r.done <= w1)
    per = lambda x: (x / duration) if duration and duration > 0 else None  # noqa: E731
    s = {
        "requests": {"measured": len(recs), "sent": len(sent), "completed": len(ok),
                     "failed": len(recs) - len(ok), "errors_by_kind": errors},
        "first_error": next((r.error[:300] for r in recs if r.error), None),
        "duration_s": None if math.isnan(duration) else duration,
        "output_tokens": out_tokens,
        "output_token_throughput": per(out_tokens),
        "request_throughput": per(len(ok)),
        "steady_state": {"window_s": [w0 - t_first, w1 - t_first] if win > 0 else None,
                         "output_token_throughput": win_tokens / win if win > 0 else None,
                         "request_throughput": win_done / win if win > 0 else None},
        "ttft_s": dist(r.ttft for r in ok),
        "tpot_s": dist(r.tpot for r in ok),
        "itl_s_pooled": dist(x for r in ok for x in r.itl),
        "e2e_s": dist(r.e2e for r in ok),
        "output_tokens_per_request": dist(r.output_tokens for r in ok),
        "input_tokens_per_request": dist(r.input_tokens for r in sent),
        "achieved_lengths": achieved_lengths(ok),
    }
    if open_loop:  # seconds from the first to the last scheduled send of the requests sent
        s["schedule_span_s"] = (max(r.scheduled for r in sent) - min(r.scheduled for r in sent)) if sent else None
        s["schedule_lag_s"] = dist(r.schedule_lag for r in sent)
        s["ttft_from_scheduled_s"] = dist(r.ttft_sched for r in ok)
        s["e2e_from_scheduled_s"] = dist(r.e2e_sched for r in ok)
    s["goodput"] = {"slo": asdict(slo), "good_requests": good, "of_requests": len(recs),
                    "fraction": good / len(recs) if recs else None, "requests_per_s": per(good)}
    srv = [r.server for r in ok if r.server and r.server.get("arrival_time_ns")]
    if srv:
        s["server_side"] = {
            "queue_s": dist((d["first_scheduled_time_ns"] - d["arrival_time_ns"]) / 1e9 for d in srv
                            if d.get("first_scheduled_time_ns")),
            "ttft_s": dist((d["first_token_time_ns"] - d["arrival_time_ns"]) / 1e9 for d in srv
                           if d.get("first_token_time_ns")),
            "e2e_s": dist((d["last_token_time_ns"] - d["arrival_time_ns"]) / 1e9 for d in srv
                          if d.get("last_token_time_ns")),
        }
        s["server_side"].update(server_counters(srv))
    return s


def by_model(records: list[RequestRecord], slo: SLO = SLO(), open_loop: bool = False) -> dict:
    """:func:`summarize` of each model's requests (``--models``: records carry the model they asked for), in the
    order the models first appear; empty when no record names one. Each model's throughput is its own requests
    over its own first send to last completion (spread round-robin, every model spans about the whole run)."""
    names = list(dict.fromkeys(r.model for r in records if r.model))
    return {m: summarize([r for r in records if r.model == m], slo, open_loop) for m in names}


def server_counters(srv: list[dict]) -> dict:
    """KV-cache reuse and speculative-decoding acceptance over requests, from the perf outputs each final response
    carries (``kv_cache_*_blocks``, ``total_draft_tokens``, ``total_accepted_draft_tokens``: TensorRT-LLM's
    RequestPerfMetrics, tests/facts/trtllm_1_2_1/perf_outputs.json). Ratios are of the sums (corpus-level, as
    TensorRT-LLM's own evaluation reports acceptance); empty where no request carried the counters."""
    out: dict = {}
    total = sum(int(d.get("kv_cache_alloc_total_blocks") or 0) for d in srv)
    if total:
        reused = sum(int(d.get("kv_cache_reused_blocks") or 0) for d in srv)
        out["kv_cache"] = {"reused_blocks": reused, "total_blocks": total, "reuse_fraction": reused / total,
                           "new_blocks": sum(int(d.get("kv_cache_alloc_new_blocks") or 0) for d in srv)}
    drafted = sum(int(d.get("total_draft_tokens") or 0) for d in srv)
    if drafted:
        accepted = sum(int(d.get("total_accepted_draft_tokens") or 0) for d in srv)
        out["speculative"] = {"draft_tokens": drafted, "accepted_draft_tokens": accepted,
                              "acceptance_rate": accepted / drafted,
                              "acceptance_rate_per_request": dist(float(d["acceptance_rate"]) for d in srv
                                                                  if d.get("total_draft_tokens"))}
    return out


def achieved_lengths(ok: list[RequestRecord]) -> dict:
    """How the output lengths that came back compare with what was asked for (max_tokens / fixed length)."""
    asked = [r for r in ok if r.requested_tokens > 0]
    if not asked:
        return {"n": 0}
    exact = sum(1 for r in asked if r.output_tokens == r.requested_tokens)
    ratios = [r.output_tokens / r.requested_tokens for r in asked]
    return {"n": len(asked), "exact": exact, "exact_fraction": exact / len(asked),
            "short": sum(1 for r in asked if r.output_tokens < r.requested_tokens),
            "achieved_over_requested": dist(ratios)}


def admission_refusals(point: dict, manifest: dict | None = None) -> dict | None:
    """Why requests of ``point`` (a report point) were refused as overloaded, or None when none was.

    Names the limit that refused them: the build's admission capacity (builders.admission: limits.max_batch_size in
    flight + serving.max_queue_size queued, from the manifest's settings) or, without a manifest (``--url``), the
    server's own words. Returns ``{"refused", "of", "capacity", "why"}`` (capacity: None when unknown or unlimited).
    """
    from builders.admission import admission_plan

    req = point["summary"]["requests"]
    n = (req.get("errors_by_kind") or {}).get("overloaded", 0)
    if not n:
        return None
    p = point["point"]
    closed = p["mode"] == "closed"
    load = f"{p['concurrency']} concurrent streams" if closed else f"{p['rate']:g} req/s offered"
    settings = (manifest or {}).get("settings") or {}
    capacity = None
    if isinstance(settings.get("limits"), dict) and isinstance(settings.get("serving"), dict):
        adm = admission_plan(settings["limits"]["max_batch_size"], settings["serving"].get("max_queue_size", 0))
        capacity = adm.capacity
        limit = f"the build admits {adm.text()}"
        if capacity is not None and closed and p["concurrency"] > capacity:
            limit += f"; {p['concurrency']} streams exceed those {capacity}"
    else:
        words = next((r["error"] for r in point.get("requests", []) if r.get("error_kind") == "overloaded"), "")
        limit = f"the server's admission limit refused them (its words: {(words or '?')[:200]})"
    return {"refused": n, "of": req["measured"], "capacity": capacity,
            "why": f"{n} of {req['measured']} requests refused as overloaded at {load}: {limit}"}

