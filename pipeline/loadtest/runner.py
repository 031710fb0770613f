"""Send the requests: asyncio gRPC streams, closed or open loop, in one or several processes.

Each connection is one ``tritonclient.grpc.aio`` client holding one bidirectional stream on
which many requests are multiplexed by ``request_id`` (one active stream per client).
Request protos are built before the clock starts, so the timed path only enqueues them and
reads responses; the stream is opened on the client's stub with ``pipeline.client.stream_request``
protos (an empty final response asked for).

Closed loop: ``concurrency`` workers, each sends its next request when the previous one
finished. Open loop: requests go at ``t0 + offset`` (absolute schedule); a late send does not
delay later ones. Both stop after their requests or at ``duration_s``; requests still in
flight then get ``drain_timeout_s`` to finish and are recorded as cut by the run's end.
A stream that broke (the server died or dropped the connection) fails its requests then and every later
request on it at once, as ``connection`` errors (no wait for ``request_timeout_s``).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import queue
import time
from dataclasses import dataclass, field

import numpy as np

from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

from pipeline.client import PERF_NAMES, build_inputs, stream_request
from pipeline.loadtest.metrics import RequestRecord
from pipeline.loadtest.workload import RequestSpec


@dataclass
class ProcPlan:
    """What one client process sends (picklable: crosses into spawned processes)."""

    url: str
    model: str
    mode: str  # "closed" | "open"
    items: list[tuple[int, float, RequestSpec]]  # (index, send offset s (open loop), payload)
    concurrency: int = 1
    connections: int = 1
    duration_s: float = math.inf
    request_timeout_s: float = 300.0
    drain_timeout_s: float = 60.0
    inputs: dict = field(default_factory=dict)  # end_id / min_tokens / return_perf_metrics / the guide inputs;
    # collect_text: keep each answer's text (Triton: text_output asked for); openai_fields: OpenAI body fields
    warmup: list[RequestSpec] = field(default_factory=list)
    endpoint: str = "triton"  # or openai-chat / openai-completions (pipeline.loadtest.openai_client)


@dataclass
class ProcResult:
    records: list[RequestRecord]
    cpu_s: float
    wall_s: float
    not_sent: int
    wall_minus_mono: float  # time.time() - time.monotonic() in this process (server ns -> client clock)


CONNECTION_KINDS = ("connection",)
"""Error kinds meaning the server could not be reached or dropped the connection (refused, reset, closed
mid-answer): the point is incomplete, and ``api.validity`` marks it invalid."""
CONNECTION_WORDS = ("connection refused", "connection reset", "connection closed", "connection aborted",
                    "socket closed", "broken pipe", "failed to connect", "connect failed", "end of tcp stream",
                    "stream removed", "server disconnected", "goaway")


OVERLOAD_WORDS = ("overloaded", "exceeds maximum queue size", "maximum queue size", "retry later")
"""Words of a server's admission refusal (the runtime's max_queue_size, Triton's queue policy): the request was
answered at once with "try again", an outcome an overload test counts apart from failures."""


def classify(message: str) -> str:
    """An error message -> a kind for ``errors_by_kind``."""
    m = message.lower()
    for kind, keys in (("cancelled", ("cancel",)), ("overloaded", OVERLOAD_WORDS), ("connection", CONNECTION_WORDS),
                       ("timeout", ("timeout", "deadline")), ("unavailable", ("unavailable", "connect", "failed to")),
                       ("invalid_request", ("invalid", "must be", "exceed", "unexpected", "not found", "expected"))):
        if any(k in m for k in keys):
            return kind
    return "server_error"


def build_request(model: str, rid: str, spec: RequestSpec, inputs: dict):
    """The ModelInferRequest proto for one request, with an empty final response asked for."""
    import tritonclient.grpc as grpcclient

    extra = {k: v for k, v in inputs.items() if k not in ("end_id", "return_perf_metrics", "openai_fields",
                                                         "collect_text", "lora_task_ids")}
    task = (inputs.get("lora_task_ids") or {}).get(spec.model) if spec.model else None
    if task:  # a LoRA adapter (--models); the base model is sent without one
        extra["lora_task_id"] = int(task)
    if "min_tokens" in extra:
        extra["min_tokens"] = int(spec.max_tokens)
    ins = build_inputs(spec.text, spec.max_tokens, stream=True, end_id=inputs.get("end_id"),
                       perf_metrics=bool(inputs.get("return_perf_metrics")), extra=extra)
    outs = [grpcclient.InferRequestedOutput("num_output_tokens")]
    if inputs.get("collect_text"):
        outs.append(grpcclient.InferRequestedOutput("text_output"))
    if inputs.get("return_perf_metrics"):
        outs += [grpcclient.InferRequestedOutput(n) for n in PERF_NAMES]
    return stream_request(model, rid, ins, outs)


class Connection:
    """One aio client with one stream; requests multiplexed by id."""

    def __init__(self, url: str):
        import tritonclient.grpc.aio as aioclient

        self.client = aioclient.InferenceServerClient(url)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.pending: dict[str, tuple[RequestRecord, asyncio.Future]] = {}
        self.call = None
        self.reader = None
        self.broken: tuple[str, str] | None = None  # (message, kind) once the stream failed: later sends fail at once

    async def _requests(self):
        while True:
            req = await self.queue.get()
            if req is None:
                return
            yield req

    def open(self) -> None:
        self.call = self.client._client_stub.ModelStreamInfer(self._requests(),
                                                              metadata=self.client._get_metadata(None))
        self.reader = asyncio.ensure_future(self._read())

    def _finish(self, rid: str, now: float, error: str | None = None, kind: str | None = None) -> None:
        rec, fut = self.pending.pop(rid)
        rec.done = now  # when it ended, answered or not (statistics read answered requests only: RequestRecord.ok)
        if error is not None:
            rec.error, rec.error_kind = error, kind
        if not fut.done():
            fut.set_result(rec)

    async def _read(self) -> None:
        try:
            async for resp in self.call:
                now = time.monotonic()
                ir = resp.infer_response
                entry = self.pending.get(ir.id)
                if entry is None:
                    continue
                rec = entry[0]
                if resp.error_message:
                    self._finish(ir.id, now, resp.error_message, classify(resp.error_message))
                    continue
                if ir.outputs:
                    n = 0
                    for i, out in enumerate(ir.outputs):
                        if out.name == "num_output_tokens":
                            n = int(np.frombuffer(ir.raw_output_contents[i], dtype="<i4").sum())
                        elif out.name == "text_output":  # BYTES: whole characters (detokenized incrementally)
                            rec.text = (rec.text or "") + b"".join(
                                deserialize_bytes_tensor(ir.raw_output_contents[i])).decode("utf-8", "replace")
                        elif out.name in PERF_NAMES:  # INT32 counters, INT64 times, FP32 acceptance_rate
                            rec.server = rec.server or {}
                            rec.server[out.name] = np.frombuffer(ir.raw_output_contents[i], dtype=np.dtype(
                                triton_to_np_dtype(out.datatype)).newbyteorder("<"))[0].item()
                    rec.response_times.append(now)
                    rec.response_tokens.append(n)
                final = ir.parameters["triton_final_response"].bool_param \
                    if "triton_final_response" in ir.parameters else False
                if final:
                    if not ir.outputs:
                        rec.response_times.append(now)
                        rec.response_tokens.append(0)
                    self._finish(ir.id, now)
        except Exception as exc:  # the stream broke: every request on it failed
            msg = getattr(exc, "details", lambda: str(exc))() or str(exc)
            code = exc.code() if callable(getattr(exc, "code", None)) else None  # grpc.StatusCode
            unreachable = getattr(code, "name", None) == "UNAVAILABLE"  # refused, reset, closed
            self._break(f"stream failed: {msg}", "connection" if unreachable else classify(str(msg)))
            return
        self._break("the server ended the stream", "connection")  # gone: nothing would answer later requests

    def _break(self, message: str, kind: str) -> None:
        self.broken = (message, kind)
        now = time.monotonic()
        for rid in list(self.pending):
            self._finish(rid, now, message, kind)

    async def send(self, rec: RequestRecord, req, timeout_s: float) -> RequestRecord:
        rec.sent = time.monotonic()
        if self.broken is not None:  # nothing reads this stream any more: fail now, not after timeout_s
            rec.error, rec.error_kind = f"{self.broken[0]} (before this request was sent)", self.broken[1]
            return rec
        fut = asyncio.get_running_loop().create_future()
        self.pending[req.id] = (rec, fut)
        self.queue.put_nowait(req)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            if req.id in self.pending:
                self._finish(req.id, time.monotonic(), f"no final response within {timeout_s:.0f} s", "timeout")
            return rec

    def abandon(self, kind: str, message: str) -> None:
        now = time.monotonic()
        for rid in list(self.pending):
            self._finish(rid, now, message, kind)

    async def close(self) -> None:
        self.queue.put_nowait(None)
        if self.call is not None:
            self.call.cancel()
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)
        await self.client.close()


def _connection(plan: ProcPlan):
    if plan.endpoint == "triton":
        return Connection(plan.url)
    from pipeline.loadtest.openai_client import OpenAIConnection

    return OpenAIConnection(plan.url, chat=plan.endpoint == "openai-chat",
                            collect_text=bool(plan.inputs.get("collect_text")))


def _payload(plan: ProcPlan, rid: str, spec: RequestSpec):
    if plan.endpoint == "triton":
        return build_request(plan.model, rid, spec, plan.inputs)
    from pipeline.loadtest.openai_client import openai_body

    return openai_body(plan.endpoint, plan.model, rid, spec, plan.inputs)


async def _run(plan: ProcPlan, t0: float | None = None, ready=None) -> ProcResult:
    conns = [_connection(plan) for _ in range(max(plan.connections, 1))]
    for c in conns:
        c.open()
    protos = [_payload(plan, str(i), spec) for i, _, spec in plan.items]
    # Warm-up: excluded from statistics, run before the clock starts.
    warm = [RequestRecord(-1 - k, 0.0, warmup=True, requested_tokens=s.max_tokens, input_tokens=s.input_tokens,
                          model=s.model or None) for k, s in enumerate(plan.warmup)]
    wprotos = [_payload(plan, f"w{k}", s) for k, s in enumerate(plan.warmup)]
    for start in range(0, len(warm), max(plan.concurrency, 1)):
        batch = range(start, min(start + max(plan.concurrency, 1), len(warm)))
        for k in batch:  # their times read as seconds before the measured run's t0 (negative) in the report
            warm[k].scheduled = time.monotonic()
        await asyncio.gather(*(conns[k % len(conns)].send(warm[k], wprotos[k], plan.request_timeout_s)
                               for k in batch))
    if ready is not None:
        t0 = await asyncio.get_running_loop().run_in_executor(None, ready)
    t0 = t0 if t0 is not None else time.monotonic()
    cpu0, wall0 = time.process_time(), time.monotonic()
    deadline = t0 + plan.duration_s
    records = [RequestRecord(i, t0 + off, input_tokens=s.input_tokens, requested_tokens=s.max_tokens,
                             model=s.model or None) for i, off, s in plan.items]
    tasks: list[asyncio.Task] = []
    sent = 0
    if plan.mode == "open":
        for k, rec in enumerate(records):
            delay = rec.scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.monotonic() >= deadline:
                break
            tasks.append(asyncio.ensure_future(conns[k % len(conns)].send(rec, protos[k], plan.request_timeout_s)))
            sent += 1
        pending = tasks
    else:
        nxt = iter(range(len(records)))

        async def worker(w: int) -> None:
            nonlocal sent
            for k in nxt:
                if time.monotonic() >= deadline:
                    return
                records[k].scheduled = time.monotonic()  # closed loop: scheduled = when the slot freed
                sent += 1
                await conns[w % len(conns)].send(records[k], protos[k], plan.request_timeout_s)

        pending = [asyncio.ensure_future(worker(w)) for w in range(plan.concurrency)]
    left = max(deadline - time.monotonic(), 0.0) + plan.drain_timeout_s
    if pending:
        await asyncio.wait(pending, timeout=left if math.isfinite(left) else None)
    for c in conns:
        c.abandon("cut_by_run_end", "still in flight when the run's duration and drain time ran out")
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for c in conns:
        await c.close()
    out = warm + [r for r in records if not math.isnan(r.sent)]
    return ProcResult(out, cpu, wall, len(records) - sent, time.time() - time.monotonic())


def _proc_entry(plan: ProcPlan, results, ready_q, go, t0v) -> None:
    """Spawned process: connect and warm up, report ready, wait for the shared t0, run, send back records."""
    def ready() -> float:
        ready_q.put(1)
        go.wait()
        return t0v.value

    try:
        results.put(asyncio.run(_run(plan, ready=ready)))
    except BaseException as exc:  # re-raised by the parent
        results.put(exc)


def run_procs(plans: list[ProcPlan], start_margin_s: float = 0.2, on_warm=None) -> list[ProcResult]:
    """Run each plan in its own spawned process, all starting on one monotonic ``t0`` (CLOCK_MONOTONIC is system-wide).

    ``on_warm()`` (optional) is called once every plan's warm-up requests have finished and before
    any measured request is sent (the server-metrics snapshot that the deltas start from).
    """
    if len(plans) == 1:  # _run calls ready() after the warm-up; its None return starts the clock there
        return [asyncio.run(_run(plans[0], ready=on_warm))]
    ctx = mp.get_context("spawn")
    results, ready_q, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    t0v = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_proc_entry, args=(p, results, ready_q, go, t0v), daemon=True) for p in plans]
    for p in procs:
        p.start()
    ready, deadline = 0, time.monotonic() + 300
    while ready < len(plans):
        try:
            ready += ready_q.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                errs = []
                while not results.empty():
                    errs.append(results.get())
                raise RuntimeError(f"client processes failed before starting: {errs or [p.exitcode for p in dead]}")
    if on_warm is not None:
        on_warm()
    t0v.value = time.monotonic() + start_margin_s
    go.set()
    out = [results.get() for _ in plans]
    for p in procs:
        p.join(timeout=10)
    errs = [r for r in out if isinstance(r, BaseException)]
    if errs:
        raise errs[0]
    return out

