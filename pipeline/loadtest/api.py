"""Run a load test: check the server, build the workload, run every sweep point, summarise."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from datetime import datetime, timezone

from plugins.errors import PipelineError
from pipeline.loadtest.config import LoadTestConfig
from pipeline.loadtest.metrics import admission_refusals, by_model, summarize
from pipeline.loadtest.runner import CONNECTION_KINDS, ProcPlan, run_procs
from pipeline.loadtest.schedule import arrival_offsets
from pipeline.loadtest.server_metrics import Sampler
from pipeline.loadtest.workload import from_jsonl, load_tokenizer, read_jsonl, synthetic

log = logging.getLogger("trtpipe")
REQUIRED_INPUTS = ("text_input", "max_tokens")
REQUIRED_OUTPUTS = ("num_output_tokens",)
OVERLOAD_FRACTION = 0.5
"""open loop: a point that completed fewer requests/s than this fraction of the rate it sent at is overloaded."""


class LoadTestError(PipelineError):
    """Bad arguments, or a server/model the load test cannot drive."""


def check_tensors(inputs: list[str], outputs: list[str], cfg: LoadTestConfig) -> list[str]:
    """Problems between the model's tensor names and what this load test will send/read."""
    p = [f"model '{cfg.model}' has no input '{n}' (it has {sorted(inputs)}): point --model at the ensemble"
         for n in REQUIRED_INPUTS if n not in inputs]
    p += [f"model '{cfg.model}' has no output '{n}' (it has {sorted(outputs)}): the load tester counts tokens "
          "from the server's num_output_tokens; rebuild the repository with this trtpipe" for n in REQUIRED_OUTPUTS
          if n not in outputs]
    if cfg.fixed_output == "min_tokens" and "min_tokens" not in inputs:
        p.append(f"--fixed-output min_tokens: model '{cfg.model}' has no min_tokens input yet; "
                 "use --ignore-eos (end_id set to an id that is never generated)")
    if any(cfg.lora_task_ids.get(m) for m in cfg.models) and "lora_task_id" not in inputs:
        p.append(f"--models: model '{cfg.model}' has no lora_task_id input, so it cannot serve the LoRA adapters "
                 f"{[m for m in cfg.models if cfg.lora_task_ids.get(m)]}: rebuild the repository with this trtpipe")
    if cfg.fixed_output == "ignore_eos" and "end_id" not in inputs:
        p.append(f"--ignore-eos: model '{cfg.model}' has no end_id input")
    if cfg.response_format is not None and not cfg.check_only and "guided_decoding_guide_type" not in inputs:
        p.append(f"--response-format: model '{cfg.model}' has no guided_decoding_guide_type input (guided "
                 "decoding): rebuild the repository with this trtpipe")
    if cfg.response_format is not None and "text_output" not in outputs:
        p.append(f"--response-format: model '{cfg.model}' has no text_output output to check the answers with: "
                 "point --model at the ensemble")
    return p


def _index(client) -> list[str] | None:
    """The repository's model names; None where the server refuses to list them (the deployment files put Triton's
    model-repository API behind a key: model_repo.launch.TRITON_ADMIN_APIS; readiness and metadata stay open)."""
    from tritonclient.utils import InferenceServerException

    try:
        return sorted({m.name for m in client.get_model_repository_index().models})
    except InferenceServerException:
        return None


def check_server(cfg: LoadTestConfig) -> dict:
    """Server reachable, model present and READY, tensors as expected; returns the model's metadata."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(cfg.url)
    try:
        try:
            client.is_server_live(client_timeout=5.0)
        except InferenceServerException as exc:
            raise LoadTestError(f"cannot reach Triton at {cfg.url} ({exc.message()}): start it with `trtpipe serve`, "
                                "or drop --url so `trtpipe loadtest` starts one") from exc
        models = _index(client)
        if models is not None and cfg.model not in models:
            raise LoadTestError(f"model '{cfg.model}' is not in the server's repository (it has {models}): "
                                "pass --model with one of those")
        if not client.is_model_ready(cfg.model):
            raise LoadTestError(f"model '{cfg.model}' is not READY on {cfg.url}: see the server log")
        md = client.get_model_metadata(cfg.model, as_json=True)
    finally:
        client.close()
    inputs, outputs = [t["name"] for t in md.get("inputs", [])], [t["name"] for t in md.get("outputs", [])]
    problems = check_tensors(inputs, outputs, cfg)
    if problems:
        raise LoadTestError("the model does not fit this load test:\n  - " + "\n  - ".join(problems))
    return {"name": cfg.model, "inputs": inputs, "outputs": outputs, "versions": md.get("versions", [])}


def check_openai(cfg: LoadTestConfig) -> dict:
    """The OpenAI server answers ``GET /models`` and serves ``cfg.model`` (default: the first model it lists);
    returns {"name": the model id, "models": every id}."""
    import urllib.error
    import urllib.request

    url = cfg.url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            ids = [m["id"] for m in json.loads(resp.read()).get("data", [])]
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        raise LoadTestError(f"cannot list models at {url} ({exc}): is an OpenAI-compatible server running there "
                            "(`trtpipe serve` starts one on serving.openai_port)?") from exc
    if not ids:
        raise LoadTestError(f"{url} lists no model")
    if cfg.model in ("", "ensemble"):  # the Triton default: take the server's model
        cfg.model = ids[0]
    if cfg.model not in ids:
        raise LoadTestError(f"model '{cfg.model}' is not served at {cfg.url} (it serves {ids}): pass --model")
    missing = [m for m in cfg.models if m not in ids]
    if missing:
        raise LoadTestError(f"--models {', '.join(missing)}: not served at {cfg.url} (it serves {ids})")
    return {"name": cfg.model, "models": ids, "inputs": [], "outputs": []}


def _inputs(cfg: LoadTestConfig, meta: dict, vocab_size: int | None, constraint=None) -> dict:
    inputs: dict = {"collect_text": True} if constraint is not None else {}
    if cfg.endpoint == "triton" and cfg.models:
        inputs["lora_task_ids"] = {m: cfg.lora_task_ids[m] for m in cfg.models}
    if cfg.endpoint != "triton":  # the output-length fix (as ignore_eos) and the constraint cross the OpenAI API
        if cfg.fixed_output == "ignore_eos":
            inputs["end_id"] = 0
        if constraint is not None and not cfg.check_only:
            inputs["openai_fields"] = constraint.openai_fields()
        return inputs
    if constraint is not None and not cfg.check_only:
        inputs.update(constraint.triton_inputs())
    if cfg.perf_metrics and "return_perf_metrics" in meta["inputs"]:
        inputs["return_perf_metrics"] = True
    if cfg.fixed_output == "min_tokens":
        inputs["min_tokens"] = 0  # replaced by each request's max_tokens
    if cfg.fixed_output == "ignore_eos":
        # An id past the vocabulary can never be generated, so generation runs to max_tokens.
        inputs["end_id"] = int(vocab_size) if vocab_size else 2**31 - 1
    return inputs


def _split(items: list, n: int) -> list[list]:
    return [items[k::n] for k in range(n)]


def run_point(cfg: LoadTestConfig, point: dict, k: int, tokenizer, inputs: dict, constraint=None) -> dict:
    """One sweep point: build its requests, send them, summarise, judge validity (and, with a structured-output
    ``constraint``, check every answer)."""
    n = cfg.num_requests
    seed = cfg.seed + 1000 * k
    if cfg.dataset is not None:
        wl = from_jsonl(cfg.dataset, n + cfg.warmup, cfg.output_len, tokenizer, seed=seed)
    else:  # unique prompts across points too (offset), so no point reuses another's KV blocks
        wl = synthetic(n + cfg.warmup, cfg.input_len, cfg.output_len, tokenizer, seed=seed,
                       offset=k * (n + cfg.warmup), shared_prefixes=cfg.shared_prefixes,
                       shared_prefix_len=cfg.shared_prefix_len)
    warm, reqs = wl.requests[:cfg.warmup], wl.requests[cfg.warmup:]
    if cfg.models:  # round-robin over the models, warm-up and measured requests alike
        warm, reqs = assign_models(warm, cfg.models), assign_models(reqs, cfg.models)
    offsets = (arrival_offsets(point["rate"], n, burstiness=cfg.burstiness, seed=seed)
               if point["mode"] == "open" else [0.0] * n)
    items = [(i, float(o), r) for i, (o, r) in enumerate(zip(offsets, reqs))]
    procs = min(cfg.client_procs, n)
    conc = point.get("concurrency", 1)
    plans = [ProcPlan(cfg.url, cfg.model, point["mode"], part, concurrency=max(1, conc // procs + (j < conc % procs)),
                      connections=cfg.connections, duration_s=cfg.duration_s,
                      request_timeout_s=cfg.request_timeout_s, drain_timeout_s=cfg.drain_timeout_s,
                      inputs=inputs, warmup=_split(warm, procs)[j], endpoint=cfg.endpoint)
             for j, part in enumerate(_split(items, procs))]
    log.info("point %d: %s, %d requests in %d process(es) x %d stream(s)", k, point, n, procs, cfg.connections)
    with Sampler(cfg.metrics_url) as sampler:
        results = run_procs(plans, on_warm=sampler.mark)
    records = [r for res in results for r in res.records]
    records.sort(key=lambda r: (not r.warmup, r.index))
    summary = summarize(records, cfg.slo, open_loop=point["mode"] == "open")
    if constraint is not None:
        summary["structured"] = check_answers(records, constraint, sent=not cfg.check_only)
    if cfg.models:
        summary["by_model"] = by_model(records, cfg.slo, open_loop=point["mode"] == "open")
    t0 = min((r.scheduled for r in records if not r.warmup), default=0.0)
    for res in results:  # server unix-ns timings -> seconds from t0 on this client's clock
        for r in res.records:
            if r.server:
                r.server["client_clock_offset_s"] = res.wall_minus_mono
    client = [{"cpu_s": res.cpu_s, "wall_s": res.wall_s, "cpu_util": res.cpu_s / res.wall_s if res.wall_s else 0.0,
               "not_sent": res.not_sent} for res in results]
    return {"point": point, "workload": wl.description, "summary": summary,
            "validity": validity(cfg, point, summary, client), "client": client,
            "server_metrics": sampler.report(t0), "t0_mono": t0,
            "requests": [r.as_dict(t0) for r in records]}


def assign_models(reqs: list, models: list[str]) -> list:
    """``reqs`` (workload RequestSpecs) with request i asking for ``models[i % len(models)]``."""
    import dataclasses

    return [dataclasses.replace(r, model=models[i % len(models)]) for i, r in enumerate(reqs)]


def check_answers(records, constraint, sent: bool = True) -> dict:
    """Check each completed measured answer against ``constraint`` (pipeline.structured.check_answer; the verdict
    goes on the record) and count them: valid, and the failures by cause. ``sent``: whether the requests carried
    the constraint (False: a --check-only baseline). An answer counts as cut when the server says ``length``
    (OpenAI) or it has max_tokens tokens (Triton)."""
    from pipeline.structured import Tally, check_answer

    tally = Tally()
    calls = 0
    for r in records:
        if r.warmup or not r.ok:
            continue
        cut = r.finish_reason == "length" if r.finish_reason else (
            r.requested_tokens > 0 and r.output_tokens >= r.requested_tokens)
        v = check_answer(constraint, r.text or "", tool_calls=r.tool_calls, cut=cut)
        r.check = v.as_dict()
        calls += len(r.tool_calls or [])
        tally.add(v)
    out = {**constraint.describe(), "sent": sent, **tally.as_dict()}
    if constraint.kind == "tools":
        out["tool_calls_parsed"] = calls
        out["answers_with_a_call"] = sum(1 for r in records if not r.warmup and r.ok and r.tool_calls)
        if constraint.tool_choice != "auto":
            out["note"] = ("a forced call streams as one event at the end (the frontend keeps the JSON until it "
                           "is whole), so TTFT here is the whole answer's time")
    return out


def validity(cfg: LoadTestConfig, point: dict, summary: dict, client: list[dict]) -> dict:
    """Is this point a measurement of the server at the asked load? Reasons when not.

    Invalid when: the client fell behind its schedule (p95 schedule lag > ``max_schedule_lag_s``) or a client
    process was busier than ``max_client_cpu``; every request failed; any request failed with a connection error
    (``runner.CONNECTION_KINDS``: refused, reset, closed mid-answer: the server went away and the run is
    incomplete); open loop above the self-checked ceiling; open loop overloaded: the completed request
    throughput (completed requests / seconds from the first send to the last completion) is below
    ``OVERLOAD_FRACTION`` (0.5) x the rate the schedule sent at ((sent - 1) / seconds from its first to its last
    scheduled send), i.e. the requests took more than twice the schedule's span to complete, so their latencies
    are set by the run's length, not the server's speed. The factor 2 leaves room for the last requests' own
    latency on short runs (100 requests at 4 req/s with 3 s requests complete at 0.9 x the offered rate on a
    server that keeps up); a server up to 2x over its capacity is not flagged. Closed-loop points pace
    themselves and are never overloaded.
    """
    reasons = []
    lag = summary.get("schedule_lag_s", {}).get("p95")
    if lag is not None and lag > cfg.max_schedule_lag_s:
        reasons.append(f"client fell behind its schedule: p95 schedule lag {lag * 1e3:.1f} ms > "
                       f"{cfg.max_schedule_lag_s * 1e3:.0f} ms (add --client-procs, or lower the rate)")
    for j, c in enumerate(client):
        if c["cpu_util"] > cfg.max_client_cpu:
            reasons.append(f"client process {j} used {c['cpu_util']:.0%} of a core (> {cfg.max_client_cpu:.0%}): "
                           "the client may be the bottleneck; add --client-procs")
    req = summary.get("requests", {})
    if req.get("sent") and not req.get("completed"):
        kinds = req.get("errors_by_kind") or {}
        first = f"; the first: {summary['first_error']}" if summary.get("first_error") else ""
        reasons.append(f"every request failed ({', '.join(f'{k}: {n}' for k, n in kinds.items()) or 'no answer'}"
                       f"{first}): nothing of the server was measured; see the requests' errors in report.json")
    lost = sum(n for kind, n in (req.get("errors_by_kind") or {}).items() if kind in CONNECTION_KINDS)
    if lost:
        reasons.append(f"server unreachable: {lost} of {req.get('measured', req.get('sent'))} requests failed with "
                       "connection errors (refused, reset or closed mid-answer): the run is incomplete; see the "
                       "server's log and the requests' errors in report.json, and rerun")
    if cfg.ceiling_rps and point["mode"] == "open" and point["rate"] > cfg.ceiling_rps:
        reasons.append(f"offered rate {point['rate']} req/s is above the client's self-checked ceiling "
                       f"{cfg.ceiling_rps:.1f} req/s")
    span, done_rps = summary.get("schedule_span_s"), summary.get("request_throughput")
    if point["mode"] == "open" and span and req.get("sent", 0) >= 2 and done_rps is not None:
        sched_rps = (req["sent"] - 1) / span
        if done_rps < OVERLOAD_FRACTION * sched_rps:
            reasons.append(f"overloaded: offered {point['rate']:g} req/s, completed {done_rps:.2f} req/s (below "
                           f"{OVERLOAD_FRACTION:g} x the {sched_rps:.1f} req/s the schedule sent at): the server "
                           "fell behind, so latencies grow with the run's length; lower --rate")
    return {"valid": not reasons, "reasons": reasons}


def run_loadtest(cfg: LoadTestConfig, *, manifest: dict | None = None) -> dict:
    """Every sweep point of ``cfg``, as one report dict (see report.py for the files)."""
    problems = cfg.problems()
    if problems:
        raise LoadTestError("bad load-test arguments:\n  - " + "\n  - ".join(problems))
    if cfg.dataset is not None:  # every bad line, before the server is asked anything
        read_jsonl(cfg.dataset)
    constraint = cfg.constraint()
    meta = check_server(cfg) if cfg.endpoint == "triton" else check_openai(cfg)
    tokenizer = load_tokenizer(cfg.tokenizer_dir)
    inputs = _inputs(cfg, meta, getattr(tokenizer, "vocab_size", None), constraint)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t = time.monotonic()
    points = [run_point(cfg, pt, k, tokenizer, inputs, constraint) for k, pt in enumerate(cfg.points())]
    for p in points:  # requests refused by the server's admission limit: say which limit
        refused = admission_refusals(p, manifest)
        if refused:
            p["admission_refusals"] = refused
    return {"tool": "trtpipe loadtest", "date": started, "wall_s": time.monotonic() - t,
            "host": {"platform": platform.platform(), "python": platform.python_version(),
                     "cpus": os.cpu_count()},
            "config": cfg.as_dict(), "server": {"url": cfg.url, "model": meta, "metrics_url": cfg.metrics_url},
            "tokenizer": tokenizer.name,
            "request_inputs": {k: v for k, v in inputs.items() if k != "collect_text"},
            "constraint": constraint.describe() if constraint is not None else None,
            "manifest": manifest, "points": points,
            "verdict": verdict(cfg, points)}


def verdict(cfg: LoadTestConfig, points: list[dict]) -> dict:
    """SLO verdict over every point, and the invalid points; passes when no point missed an SLO (trivially when
    none was given) and none is invalid. ``refused_as_overloaded``: point -> why its requests were refused by the
    server's admission limit (metrics.admission_refusals), for the points where some were."""
    invalid = [k for k, p in enumerate(points) if not p["validity"]["valid"]]
    missed = []
    if cfg.slo.given:
        for k, p in enumerate(points):
            frac = p["summary"]["goodput"]["fraction"]
            if frac is None or math.isnan(frac) or frac < cfg.slo_attainment:
                missed.append(k)
    refused = {k: p["admission_refusals"]["why"] for k, p in enumerate(points) if p.get("admission_refusals")}
    return {"slo_given": cfg.slo.given, "slo_attainment": cfg.slo_attainment, "slo_missed_points": missed,
            "invalid_points": invalid, "refused_as_overloaded": refused, "passed": not missed and not invalid}
