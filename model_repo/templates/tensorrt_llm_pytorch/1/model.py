# The `tensorrt_llm` model for the portable `pytorch` runtime (Triton Python backend).
#
# In-flight batching with a paged KV cache, from transformers' continuous batching
# (`ContinuousBatchingManager`). By default (engine_process true) the generation loop runs in
# its own process (engine_worker.py) and a receiver thread here routes each step's outputs to
# their requests' response senders (decoupled streaming); `execute` only validates and
# enqueues requests. With engine_process false the loop runs in a thread of this stub and the
# outputs are sent by a dispatcher thread or, with response_dispatch "inline", by the
# generation thread itself. Same tensors as the TensorRT-LLM
# C++ backend: input_ids/input_lengths/request_output_len in, output_ids/sequence_length out.
# In streaming mode each response carries the tokens generated since the previous one.
# Decoding options (temperature, top_k, top_p, seed, penalties, min_tokens, log probs) are per
# request: see sampling.py beside this file. num_return_sequences = n runs n sequences of one
# request (each response names its sequence_index); beam search is refused. The batching settings
# (KV pool, block size, batch token budget, cuda_graph_mode, library_defaults: transformers' own
# sizing instead, sdpa_backends: the attention kernels torch may pick) are config.pbtxt parameters,
# read by trtpipe_runtime.runtime_config.runtime_settings.

import json as _json
import os as _os
import sys as _sys

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import collections
import threading
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

import engine_worker as engine
import sampling
from trtpipe_runtime.params import choice, param as _param
from trtpipe_runtime.runtime_config import runtime_settings
from trtpipe_runtime.triton_io import FINAL, opt_scalar as _opt_scalar, output_dtypes as _output_dtypes
from trtpipe_runtime.triton_io import perf_tensors as _perf_tensors, words as _words

_WORKER_PY = engine.__file__


def _row(arr, b, batch):
    """Row ``b`` of a batched input (first dim ``batch``), or the input itself when it was sent once."""
    arr = np.asarray(arr)
    return arr.reshape(batch, -1)[b] if arr.ndim and arr.shape[0] == batch and batch > 1 else arr.reshape(-1)


def _row_scalar(request, name, b, batch, default=None):
    """Entry ``b`` of an optional scalar input as a Python scalar; ``default`` when absent or empty."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None or t.as_numpy().size == 0:
        return default
    return _row(t.as_numpy(), b, batch)[0].item()


EARLY_STOP_S = 60.0
"""How long a `stop` that matched no request is kept for a request with its id that arrives later."""


class RequestError(ValueError):
    """A per-request validation error: sent to that request only; the server keeps serving."""


class _Group:
    """The sequences of one Triton request (num_return_sequences): the last one to finish sends FINAL.

    The final send and the canceller's is_cancelled() take this group's lock: Triton's Python backend
    (2.51) releases a response factory after its final response, and an is_cancelled() that reaches a
    released one crashes the server (TRITONBACKEND_ResponseFactoryIsCancelled; server issues #8192, #8034)."""

    __slots__ = ("remaining", "closed", "lock")

    def __init__(self, n):
        self.remaining = n
        self.closed = False
        self.lock = threading.Lock()

    def send_final(self, sender, response=None):
        """Send the request's FINAL response unless one was sent; True when this call sent it."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            if response is None:
                sender.send(flags=FINAL)
            elif response.has_error():  # apart: Triton 2.51's BLS iterator loses an error sent with FINAL mid-stream
                sender.send(response)    # and then waits forever; this way its caller at least sees the end
                sender.send(flags=FINAL)
            else:
                sender.send(response, flags=FINAL)
            return True

    def is_cancelled(self, sender):
        """The client cancelled and no final response was sent yet (never asks a released factory)."""
        with self.lock:
            return not self.closed and sender.is_cancelled()


class _Request:
    __slots__ = ("rid", "sender", "streaming", "end_ids", "sent", "arrival_ns", "first_token_ns",
                 "last_token_ns", "first_scheduled_ns", "perf", "prompt_len", "max_new_tokens", "stop_ids",
                 "triton_request", "cancelled", "done", "group", "seq_index", "handle", "prompt_ids",
                 "exclude_input", "log_probs", "kv_blocks", "triton_id", "batch_index", "gen_logits", "tokens",
                 "counted")

    def __init__(self, rid, sender, streaming, end_ids, prompt_len, max_new_tokens, perf, stop_ids, triton_request,
                 group=None, seq_index=0, handle=-1, prompt_ids=(), exclude_input=True, log_probs=False,
                 batch_index=0, gen_logits=False):
        self.rid = rid
        self.sender = sender
        self.streaming = streaming
        self.end_ids = end_ids
        self.sent = 0
        self.arrival_ns = time.time_ns()
        self.first_scheduled_ns = 0
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.perf = perf
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens
        self.stop_ids = stop_ids
        self.triton_request = triton_request
        self.cancelled = False
        self.done = False
        self.group = group or _Group(1)
        self.seq_index = seq_index
        self.handle = handle
        self.prompt_ids = list(prompt_ids)
        self.exclude_input = exclude_input
        self.log_probs = log_probs
        self.kv_blocks = 0  # most KV blocks the sequence held (perf output kv_cache_alloc_new_blocks)
        self.triton_id = triton_request.request_id() if triton_request is not None else ""
        self.batch_index = batch_index
        self.gen_logits = gen_logits
        self.tokens = []  # the generated tokens seen so far (end id dropped)
        self.counted = 0  # of them, counted in tokens_total


class _Output:
    """One sequence's state after a step, shaped like transformers' GenerationOutput for _deliver."""

    __slots__ = ("request_id", "generated_tokens", "finished", "error")

    def __init__(self, request_id, generated_tokens, finished, error):
        self.request_id, self.generated_tokens, self.finished, self.error = request_id, generated_tokens, finished, error

    def is_finished(self):
        return self.finished


def _worker_python():
    """A python of the stub's own version for engine_worker.py (the worker gets the stub's sys.path, which
    holds that version's standard library): the stub's interpreter when it is a python executable, the
    one under its prefix, else pythonX.Y or python3 on PATH (version checked)."""
    import shutil
    import subprocess

    version = f"{_sys.version_info[0]}.{_sys.version_info[1]}"
    candidates = [_sys.executable if _os.path.basename(_sys.executable or "").startswith("python") else None]
    candidates += [_os.path.join(prefix, "bin", f"python{version}") for prefix in (_sys.prefix, _sys.base_prefix)]
    candidates += [shutil.which(f"python{version}"), shutil.which("python3")]
    for path in candidates:
        if path and _os.path.isfile(path) and _os.access(path, _os.X_OK):
            out = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=60)
            if out.stdout.strip() == version:
                return path
    return None


class _EngineProcess:
    """The manager of engine_process = true: takes the calls model.py makes on a manager and forwards them
    over a socketpair to engine_worker.py, which runs the generation loop in its own process (protocol in
    that file). A receiver thread turns each step message into outputs and routes them; it is this
    mode's dispatcher and the only per-step work in the stub's interpreter."""

    def __init__(self, owner, engine_dir, settings, device, dtype, python):
        import socket
        import subprocess
        from multiprocessing.connection import Connection

        self.owner, self.tokens, self.kv_blocks, self._kv_free, self.stopping = owner, {}, {}, None, False
        self.dead = None  # why the worker is gone, once it died
        self.send_lock = threading.Lock()
        python = python or _worker_python()
        if not python:
            raise pb_utils.TritonModelException(
                f"engine_process = true needs a python{_sys.version_info[0]}.{_sys.version_info[1]} for the worker "
                "(the stub's version): set the engine_python parameter or put it on PATH")
        ours, theirs = socket.socketpair()
        env = dict(_os.environ, PYTHONPATH=_os.pathsep.join(p for p in _sys.path if p))
        self.proc = subprocess.Popen([python, _WORKER_PY, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                     env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(("init", engine_dir, settings, device, dtype))
        deadline = time.monotonic() + 3600
        while not self.conn.poll(1.0):  # model load: up to minutes for a large model
            if time.monotonic() > deadline:
                self.stop(timeout=1)
                raise pb_utils.TritonModelException("the engine worker was not ready after an hour")
            if self.proc.poll() is not None:
                raise pb_utils.TritonModelException(
                    f"the engine worker ({python} {_WORKER_PY}) exited with {self.proc.returncode} before it was "
                    "ready: see its messages above in the server log")
        kind, payload = self.conn.recv()
        if kind != "ready":
            self.stop()
            raise pb_utils.TritonModelException(f"the engine worker failed to start: {payload}")
        self.info = payload
        self.receiver = threading.Thread(target=self._receive, name="trtpipe-engine-receiver", daemon=True)

    def _send(self, message):
        with self.send_lock:
            self.conn.send(message)

    def start(self):
        self.receiver.start()

    def add_request(self, ids, request_id, max_new_tokens, streaming, eos_token_id, **kw):
        import dataclasses

        entry = self.owner.table.get(kw[sampling.HANDLE_KWARG])
        params = dict(dataclasses.asdict(entry.params), seed_drawn=entry.seed)
        state = self.owner.requests.get(request_id)
        self._send(("add", request_id, list(ids), max_new_tokens, eos_token_id, params,
                    bool(state is not None and state.perf)))
        return request_id

    def cancel_request(self, request_id):
        try:
            self._send(("cancel", request_id))
        except OSError:
            pass  # the worker is gone; _receive fails what was live

    def kv_free(self):
        """The free-block count the worker last reported; asks for a fresh one."""
        try:
            self._send(("kv",))
        except OSError:
            pass
        return self._kv_free

    def _receive(self):
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "kv":
                self._kv_free = message[1]
                continue
            outputs, done = [], []
            for rid, new, finished, error, lps, blocks, logits in message[1]:
                state = self.owner.requests.get(rid)
                if state is None:  # cancelled or failed meanwhile
                    self.tokens.pop(rid, None)
                    self.kv_blocks.pop(rid, None)
                    continue
                tokens = self.tokens.setdefault(rid, [])
                tokens.extend(new)
                entry = self.owner.table.get(state.handle) if (lps or logits) else None
                if entry is not None:
                    entry.log_probs.extend(lps or ())
                    entry.logits.extend(logits or ())
                if blocks is not None:
                    self.kv_blocks[rid] = max(self.kv_blocks.get(rid, 0), blocks)
                outputs.append(_Output(rid, tokens, finished, error))
                if finished:
                    done.append(rid)
            self.owner._route_batch(outputs)
            for rid in done:
                self.tokens.pop(rid, None)
                self.kv_blocks.pop(rid, None)
        if not self.stopping:  # the worker died: every live request, and every later one, ends with the reason
            try:
                code = self.proc.wait(timeout=5)
            except Exception:
                code = self.proc.poll()
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            self.dead = (f"the engine worker process (pid {self.proc.pid}) died ({how}): this model cannot generate "
                         "until the server restarts (`trtpipe stop`, then `trtpipe serve`)")
            pb_utils.Logger.log_error(f"tensorrt_llm: {self.dead}")
            self.owner._route_batch([_Output(rid, [], True, self.dead) for rid in list(self.owner.requests)])

    def stop(self, block=True, timeout=10):
        self.stopping = True
        try:
            self._send(("stop",))
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


class TritonPythonModel:
    def initialize(self, args):
        cfg = _json.loads(args["model_config"])
        self.model_config = cfg
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        engine_dir = _param(cfg, "gpt_model_path")
        if not engine_dir or not _os.path.isfile(_os.path.join(engine_dir, "engine.json")):
            raise pb_utils.TritonModelException(
                f"gpt_model_path={engine_dir!r} does not hold a pytorch-runtime engine (engine.json missing); "
                "rebuild with `trtpipe build` and regenerate the repository")
        with open(_os.path.join(engine_dir, "engine.json")) as fh:
            self.engine = _json.load(fh)
        bc = self.engine["build_config"]
        params = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
        self.settings = runtime_settings(params, bc)
        for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "tokens_per_block",
                    "num_blocks"):
            setattr(self, key, self.settings[key])
        device = _param(cfg, "device", "cpu")
        dtype = _param(cfg, "runtime_dtype", "float32")
        self.engine_process = choice(cfg, "engine_process") == "true"
        self.vocab_size = int(self.engine["pretrained_config"]["vocab_size"])
        self.requests = {}
        self.early_stops = {}  # request id -> when a stop for it matched nothing (the request may still come)
        if self.engine_process:  # the generation loop in its own process (engine_worker.py)
            self.table = sampling.RequestTable()  # here: each request's options, seed and log probs
            self.manager = _EngineProcess(self, engine_dir, self.settings, device, dtype,
                                          choice(cfg, "engine_python"))
            info = self.manager.info
        else:
            self.manager, self.table, info = engine.build_manager(engine_dir, self.settings, device, dtype)
        self.default_end_ids, self.pad_id = info["default_end_ids"], info["pad_id"]
        self.exclude_input_default = _param(cfg, "exclude_input_in_output", "false") == "true"
        self.output_dtypes = _output_dtypes(cfg)

        self.lock = threading.Lock()
        self.stats = {"requests_total": 0, "requests_failed": 0, "requests_cancelled": 0, "inflight": 0,
                      "generating": 0, "max_concurrent_generating": 0, "tokens_total": 0, "responses_total": 0,
                      "steps_total": 0}
        # seconds spent building responses and in sender.send (the round trip to the server), per thread
        # that sends (dispatcher or generation thread): published as trtpipe_runtime_response_seconds_total
        self.response_seconds = {"build": 0.0, "send": 0.0}
        self._published = {k: 0 for k in self._COUNTER_STATS}
        self._published_seconds = dict(self.response_seconds)
        self._init_metrics()
        self.stop_event = threading.Event()
        try:
            self._start_routing(cfg)
        except BaseException:
            if self.engine_process:
                self.manager.stop()  # the worker must not outlive a model that failed to load
            raise
        pb_utils.Logger.log_info(
            f"tensorrt_llm[pytorch]: engine {engine_dir}, device {device}, dtype {dtype}, max_batch_size "
            f"{self.max_batch_size}, KV pool {self.num_blocks} blocks x {self.tokens_per_block} tokens, "
            f"response dispatch {self.dispatch}, attention kernels torch may use {info.get('sdpa_backends')}, "
            f"settings {self.settings}")

    def _start_routing(self, cfg):
        """Route the manager's per-step outputs (dispatcher thread, inline, or the engine process's
        receiver), start the manager and the housekeeping thread."""
        self.dispatch = "engine process" if self.engine_process else choice(cfg, "response_dispatch")
        if not self.engine_process:  # (with engine_process, _EngineProcess's receiver thread routes)
            router = getattr(self.manager, "output_router", None)
            if router is None or not hasattr(router, "deliver_batch"):
                raise pb_utils.TritonModelException(
                    "this transformers has no continuous-batching OutputRouter.deliver_batch (5.17 and 5.24 have "
                    "it): install the version the project pins")
            if self.dispatch == "inline":
                router.deliver_batch = self._route_batch
            elif self.dispatch == "thread":
                self._handed = collections.deque()
                self._wake = threading.Event()
                router.deliver_batch = self._hand_over
                self.dispatcher = threading.Thread(target=self._dispatch_loop, name="trtpipe-dispatch", daemon=True)
                self.dispatcher.start()
            else:
                raise pb_utils.TritonModelException(
                    f"response_dispatch = {self.dispatch!r}: must be 'thread' or 'inline'; regenerate the repository")
            router.deliver = lambda output: router.deliver_batch([output])  # the library's error path
        self.manager.start()
        self.canceller = threading.Thread(target=self._cancel_loop, name="trtpipe-cancel", daemon=True)
        self.cancel_period = int(_param(cfg, "cancellation_check_period_ms", "100")) / 1000.0
        self.canceller.start()

    # ---- metrics (Triton's /metrics endpoint) --------------------------------------------------
    def _init_metrics(self):
        labels = {"model": "tensorrt_llm", "runtime": "pytorch"}
        gauges = pb_utils.MetricFamily(name="trtpipe_runtime_requests",
                                       description="Requests in the runtime by state (inflight = accepted and "
                                                   "not finished; queued = accepted, no token yet; generating = "
                                                   "at least one token produced and not finished; "
                                                   "max_concurrent_generating = high-water mark)",
                                       kind=pb_utils.MetricFamily.GAUGE)
        self.metric = {k: gauges.Metric(labels={**labels, "state": k})
                       for k in ("inflight", "queued", "generating", "max_concurrent_generating")}
        counters = pb_utils.MetricFamily(name="trtpipe_runtime_total",
                                         description="Totals since start: requests accepted, failed, cancelled, "
                                                     "tokens generated, responses sent, generation steps that "
                                                     "produced output",
                                         kind=pb_utils.MetricFamily.COUNTER)
        self.counter = {k: counters.Metric(labels={**labels, "kind": k}) for k in self._COUNTER_STATS}
        seconds = pb_utils.MetricFamily(name="trtpipe_runtime_response_seconds_total",
                                        description="Seconds spent returning tokens: building responses (stage "
                                                    "build) and in response_sender.send, the round trip to the "
                                                    "server (stage send)",
                                        kind=pb_utils.MetricFamily.COUNTER)
        self.seconds_metric = {k: seconds.Metric(labels={**labels, "stage": k}) for k in ("build", "send")}
        kv = pb_utils.MetricFamily(name="trtpipe_runtime_kv_cache_blocks",
                                   description="Paged KV cache blocks of the runtime by state (free, total)",
                                   kind=pb_utils.MetricFamily.GAUGE)
        self.kv_metric = {k: kv.Metric(labels={**labels, "state": k}) for k in ("free", "total")}
        self._families = (gauges, counters, seconds, kv)  # a Metric must not outlive its family

    def kv_free_blocks(self):
        """Free blocks of the paged KV cache (None before the first batch creates it, or on transformers
        5.17, which cannot tell: the gauge is then not exported rather than failing requests)."""
        if self.engine_process:
            return self.manager.kv_free()
        return engine.free_blocks(self.manager, self.num_blocks)

    def kv_blocks_of(self, rid):
        """KV blocks the cache holds for one sequence now (0 when unknown or freed)."""
        if self.engine_process:
            return self.manager.kv_blocks.get(rid, 0)
        return engine.blocks_of(self.manager, rid)

    _COUNTER_STATS = {"requests": "requests_total", "failed": "requests_failed", "cancelled": "requests_cancelled",
                      "tokens": "tokens_total", "responses": "responses_total", "steps": "steps_total"}

    def _publish(self):
        """Push the request gauges, the counters' increments since the last call and the KV gauge to
        Triton. Called from the housekeeping thread every cancellation_check_period_ms, never per
        token, because each metric update is a round trip from this stub to the server that would
        compete with the generation thread for the GIL."""
        with self.lock:
            self.stats["queued"] = self.stats["inflight"] - self.stats["generating"]
            values = {k: self.stats[k] for k in ("inflight", "queued", "generating", "max_concurrent_generating")}
            totals = {k: self.stats[v] for k, v in self._COUNTER_STATS.items()}
            seconds = dict(self.response_seconds)
        for k, v in values.items():
            self.metric[k].set(v)
        for k, v in totals.items():
            if v > self._published[k]:
                self.counter[k].increment(v - self._published[k])
                self._published[k] = v
        for k, v in seconds.items():
            if v > self._published_seconds[k]:
                self.seconds_metric[k].increment(v - self._published_seconds[k])
                self._published_seconds[k] = v
        free = self.kv_free_blocks()
        self.kv_metric["total"].set(self.num_blocks)
        if free is not None:
            self.kv_metric["free"].set(free)

    # ---- request intake -----------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender() if self.decoupled else None
            try:
                self._enqueue(request, sender)
            except (RequestError, sampling.SamplingError) as exc:
                self._fail(request, sender, str(exc))
            except Exception as exc:  # never let one bad request take the model down
                self._fail(request, sender, f"internal error: {type(exc).__name__}: {exc}")
        return None

    def _fail(self, request, sender, message, counted=True):
        """Answer a request that was never registered (validation failed) with an error; ``counted``: as a
        failed request in the runtime's counters."""
        if counted:
            with self.lock:
                self.stats["requests_failed"] += 1
        response = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
        if sender is not None:
            sender.send(response, flags=FINAL)
        else:
            raise pb_utils.TritonModelException(message)

    def _enqueue(self, request, sender):
        if getattr(self.manager, "dead", None):  # also for `stop`: tensorrt_llm_bls asks why a stream ended
            raise RequestError(self.manager.dead)
        if bool(_opt_scalar(request, "stop", False)):
            self._stop(request, sender)
            return
        if self.early_stops and self.early_stops.pop(request.request_id(), None) is not None:
            with self.lock:
                self.stats["requests_cancelled"] += 1
            sender.send(flags=FINAL)  # stopped before it arrived: ends normally, with nothing generated
            return
        missing = [n for n in ("input_ids", "input_lengths", "request_output_len")
                   if pb_utils.get_input_tensor_by_name(request, n) is None]
        if missing:  # Triton checks required inputs only when the number of inputs is out of range
            raise RequestError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: send "
                               "input_ids, input_lengths and request_output_len (the required inputs)")
        if not self.decoupled:
            raise RequestError("this runtime serves decoupled (streaming) transactions only; "
                               "regenerate the repository with serving.streaming: true")
        if _opt_scalar(request, "return_context_logits", False):
            raise RequestError("return_context_logits: the pytorch runtime computes logits at the last prompt "
                               "position only (transformers' continuous batching); drop it (generation_logits "
                               "are returned)")
        ids_t = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
        ids_t = ids_t.reshape(1, -1) if ids_t.ndim == 1 else ids_t
        batch = ids_t.shape[0]
        # Every entry of a batched request (the ensemble's text_input [B, 1]) is its own sequence; each response
        # names it in batch_index, as the C++ backend splits a batch into requests (one sender for all).
        rows = [self._parse_row(request, ids_t, b, batch) for b in range(batch)]
        n_total = sum(row["n_seq"] for row in rows)
        if n_total > self.max_batch_size:
            raise RequestError(f"{batch} prompt(s) x num_return_sequences = {n_total} sequences, above max_batch_size "
                               f"{self.max_batch_size}: send fewer in one request")
        limit = self.settings["max_queue_size"]
        with self.lock:
            waiting = self.stats["inflight"] - self.stats["generating"]
        if limit and waiting + n_total > limit:  # TensorRT-LLM's max_queue_size: reject, never wait unbounded
            raise RequestError(f"overloaded: {waiting} requests wait for a batch slot and serving.max_queue_size is "
                               f"{limit}: retry later")
        group = _Group(n_total)
        perf = bool(_opt_scalar(request, "return_perf_metrics", False))
        streaming = bool(_opt_scalar(request, "streaming", False))
        states = []
        for b, row in enumerate(rows):
            params = row["params"]
            for i in range(row["n_seq"]):
                seq_params = params
                if i and params.seed is not None:  # sequence i of a seeded request: seed + i (reproducible, distinct)
                    seq_params = sampling.SamplingParams(**{**params.__dict__, "seed": params.seed + i})
                handle = self.table.add(seq_params)
                states.append(_Request(uuid.uuid4().hex, sender, streaming, row["end_ids"], len(row["ids"]),
                                       row["max_new"], perf, row["stop_ids"], request, group=group, seq_index=i,
                                       handle=handle, prompt_ids=row["ids"], exclude_input=row["exclude"],
                                       log_probs=params.return_log_probs, batch_index=b,
                                       gen_logits=params.return_generation_logits))
        with self.lock:
            for state in states:
                self.requests[state.rid] = state
                self.stats["inflight"] += 1
            self.stats["requests_total"] += 1
        for state in states:
            try:
                added = self.manager.add_request(state.prompt_ids, request_id=state.rid,
                                                 max_new_tokens=state.max_new_tokens, streaming=True,
                                                 eos_token_id=state.end_ids if state.end_ids else -1,
                                                 **{sampling.HANDLE_KWARG: state.handle})
            except Exception as exc:  # e.g. the manager's queue stayed full
                added, why = None, f"{type(exc).__name__}: {exc}"
            else:
                why = "stopping or queue full"
            if added is None:
                with self.lock:
                    for other in states:
                        if not other.done:
                            self._retire_locked(other)
                for other in states:
                    self.manager.cancel_request(other.rid)
                raise RequestError(f"the runtime is not accepting requests ({why}): retry later")

    def _parse_row(self, request, ids_t, b, batch):
        """Validate entry ``b`` of a request: its prompt, limits and decoding options (every input is read at
        row ``b``; an input sent once applies to every row). Raises RequestError / SamplingError."""
        def get(name, default=None):
            return _row_scalar(request, name, b, batch, default)

        where = f" (batch entry {b})" if batch > 1 else ""
        input_len = int(get("input_lengths", ids_t.shape[-1]))
        ids = ids_t[b, :input_len].astype(np.int64).tolist()
        max_new = int(get("request_output_len", 0))
        if input_len <= 0 or not ids:
            raise RequestError(f"input_ids is empty{where} (input_lengths = {input_len}): the prompt must hold at "
                               "least one token")
        if input_len > ids_t.shape[-1]:
            raise RequestError(f"input_lengths = {input_len}{where} but input_ids holds {ids_t.shape[-1]} ids: send "
                               "the number of prompt tokens in input_ids")
        if input_len > self.max_input_len:
            raise RequestError(f"input_ids: the prompt has {input_len} tokens{where}, above the engine's "
                               f"max_input_len {self.max_input_len}: shorten the prompt")
        if max_new <= 0:
            raise RequestError(f"request_output_len (max_tokens) = {max_new}{where}: must be at least 1")
        if input_len + max_new > self.max_seq_len:
            raise RequestError(f"prompt ({input_len} tokens) + request_output_len (max_tokens) {max_new} = "
                               f"{input_len + max_new}{where} exceeds the engine's max_seq_len {self.max_seq_len}: "
                               f"lower max_tokens to at most {self.max_seq_len - input_len}")
        if max(ids) >= self.vocab_size or min(ids) < 0:
            raise RequestError(f"input_ids holds token id {max(ids) if max(ids) >= self.vocab_size else min(ids)}"
                               f"{where}, outside the vocabulary [0, {self.vocab_size}): send ids the model's "
                               "tokenizer gives")
        beam_width = int(get("beam_width", 1))
        if beam_width != 1:
            raise RequestError(f"beam_width = {beam_width}: the pytorch runtime has no beam search (transformers' "
                               "continuous batching samples one token per sequence); send beam_width 1, or use "
                               "num_return_sequences with sampling for several answers")
        n_seq = int(get("num_return_sequences", 1))
        if not 1 <= n_seq <= self.max_batch_size:
            raise RequestError(f"num_return_sequences = {n_seq}: must be between 1 and max_batch_size "
                               f"{self.max_batch_size}")
        end_id = get("end_id", None)
        if end_id is not None and end_id < -1:
            raise RequestError(f"end_id = {end_id}{where}: must be a token id >= 0, or -1 for none (an id the model "
                               "never generates, -1 or vocab_size, lets the answer run to max_tokens)")
        end_ids = sampling.request_end_ids(end_id, self.default_end_ids)
        exclude = bool(get("exclude_input_in_output", self.exclude_input_default))
        stop_ids = self._word_ids(request, "stop_words_list", b, batch, where)
        # One-token stop words that are end ids of the model (preprocessing sends generation_config.json's
        # other eos ids that way) are end ids here: dropped from the output and held back by min_tokens.
        end_ids += [w[0] for w in stop_ids if len(w) == 1 and w[0] in self.default_end_ids and w[0] not in end_ids]
        stop_ids = [w for w in stop_ids if not (len(w) == 1 and w[0] in end_ids)]
        bias = pb_utils.get_input_tensor_by_name(request, "embedding_bias")
        bias = None if bias is None else _row(bias.as_numpy(), b, batch)
        params = sampling.parse_params(get, end_ids=end_ids, max_new_tokens=max_new,
                                       bad_words=self._word_ids(request, "bad_words_list", b, batch, where),
                                       embedding_bias=bias,
                                       vocab_size=self.vocab_size)
        if n_seq > 1 and params.greedy:
            raise RequestError(f"num_return_sequences = {n_seq} with greedy decoding gives {n_seq} identical "
                               "answers: also send top_k > 1 or top_p > 0 (a temperature alone is greedy)")
        return {"ids": ids, "max_new": max_new, "n_seq": n_seq, "end_ids": end_ids, "exclude": exclude,
                "stop_ids": stop_ids, "params": params}

    def _word_ids(self, request, name, b, batch, where):
        """stop_words_list / bad_words_list entry ``b`` as token-id lists; RequestError for an id outside the
        vocabulary (a bad word's id there would stop the generation loop: the library's ban raises on it)."""
        words = _words(request, name, b, batch)
        bad = [t for w in words for t in w if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"{name} holds token id {bad[0]}{where}, outside the vocabulary [0, "
                               f"{self.vocab_size}): send the ids of the words (preprocessing builds the list)")
        return words

    def _stop(self, request, sender):
        """A request with ``stop`` = true stops the in-flight request(s) that carry the same Triton request
        id, as the TensorRT-LLM C++ backend does (inflight_batcher_llm handleStopRequest cancels them in the
        executor): each stopped sequence ends normally, with a final response holding what it had not yet
        sent; the stop request gets an empty final response (also when nothing matched: the request may
        have finished already). This is how `tensorrt_llm_bls` forwards a client's cancellation: Triton's
        ensemble does not."""
        triton_id = request.request_id()
        if not triton_id:  # not counted as a failed request: tensorrt_llm_bls's liveness probe is this one
            self._fail(request, sender, "stop = true needs the request_id of the request to stop", counted=False)
            return
        with self.lock:
            stopped = [st for st in self.requests.values() if st.triton_id == triton_id and not st.done]
            for state in stopped:
                state.cancelled = True
            if stopped and not stopped[0].group.closed:
                self.stats["requests_cancelled"] += 1
            if not stopped:  # the stop overtook its request (BLS forwards a cancel while it queues): ends at once
                now = time.monotonic()
                self.early_stops = {k: t for k, t in self.early_stops.items() if now - t < EARLY_STOP_S}
                self.early_stops[triton_id] = now
        for state in stopped:
            self.manager.cancel_request(state.rid)  # the library frees its KV blocks
            tokens = list(state.tokens)
            if state.streaming:
                self._send(state, tokens[state.sent:], state.sent, final=True)
            else:
                self._send(state, tokens, 0, final=True)
        sender.send(flags=FINAL)

    def _cancel_locked(self, state, message):
        """End a live sequence early (caller holds self.lock): the library frees its KV blocks, and the
        client hears ``message`` as the request's final error, once per request (num_return_sequences)."""
        state.cancelled = True
        self.manager.cancel_request(state.rid)
        self._retire_locked(state)
        if state.group.send_final(state.sender, pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError(message))):
            self.stats["requests_cancelled"] += 1

    # ---- output routing -----------------------------------------------------------------------
    def _hand_over(self, outputs):
        """response_dispatch "thread": the library's per-step delivery (generation thread) hands the step's
        outputs to the dispatcher in one append and one wake-up, instead of the library's queue.put per
        output (each put wakes the consumer, which then competes with the generation thread for the GIL)."""
        self._handed.append(outputs)
        self._wake.set()

    def _dispatch_loop(self):
        while not self.stop_event.is_set():
            if not self._wake.wait(0.05):
                continue
            self._wake.clear()
            # Each request's newest output only (generated_tokens is cumulative; a finished or failed output is
            # a request's last): when this thread falls behind, one response carries several tokens.
            latest = {}
            while self._handed:
                for output in self._handed.popleft():
                    latest[output.request_id] = output
            self._route_batch(latest.values())

    def _route_batch(self, outputs):
        """Route one step's outputs (response_dispatch "inline": called by the library in its generation
        thread, so every response of a step is sent before the next step starts). Never raises."""
        self.stats["steps_total"] += 1  # one writer: the thread that routes
        for result in outputs:
            try:
                self._route(result)
            except Exception as exc:  # never into the generation loop
                pb_utils.Logger.log_error(f"tensorrt_llm: routing {getattr(result, 'request_id', '?')} failed: {exc}")

    def _route(self, result):
        """Deliver one result to its request; a delivery failure ends that request with an error."""
        with self.lock:
            state = self.requests.get(result.request_id)
        if state is None or state.done:
            return
        try:
            self._deliver(state, result)
        except Exception as exc:  # a broken sender must not stop the loop
            pb_utils.Logger.log_error(f"tensorrt_llm: delivering {state.rid} failed: {exc}")
            with self.lock:
                if not state.done:
                    self._retire_locked(state)
                    try:  # the client must hear that its request ended, not wait for a timeout
                        state.group.send_final(state.sender, pb_utils.InferenceResponse(
                            output_tensors=[], error=pb_utils.TritonError(
                                f"internal error while returning tokens: {type(exc).__name__}: {exc}")))
                    except Exception:
                        pass  # the sender itself is what broke
            self.manager.cancel_request(state.rid)

    def _deliver(self, state, result):
        now = time.time_ns()
        tokens = list(result.generated_tokens)
        finished = result.is_finished()
        if result.error:
            with self.lock:
                if state.done:
                    return
                self._retire_locked(state)
                self.stats["requests_failed"] += 1
                state.group.send_final(state.sender, pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"generation failed: {result.error}")))
            return
        if state.first_scheduled_ns == 0:
            state.first_scheduled_ns = now
        if state.perf:
            state.kv_blocks = max(state.kv_blocks, self.kv_blocks_of(state.rid))
        # Drop end tokens (the C++ backend does not return end_id either) and apply stop words.
        stop_hit = False
        if tokens and tokens[-1] in state.end_ids:
            tokens = tokens[:-1]
            finished = True
        for word in state.stop_ids:
            n = len(word)
            if n and len(tokens) >= n and tokens[-n:] == word:
                stop_hit = True
        state.tokens = tokens
        new = tokens[state.sent:]
        if len(tokens) > state.counted:  # each token once, streamed or not
            self.stats["tokens_total"] += len(tokens) - state.counted  # only this thread writes it; _publish reads
            state.counted = len(tokens)
        if new:
            if state.first_token_ns == 0:
                state.first_token_ns = now
                with self.lock:
                    self.stats["generating"] += 1
                    self.stats["max_concurrent_generating"] = max(self.stats["max_concurrent_generating"],
                                                                  self.stats["generating"])
            state.last_token_ns = now
        if stop_hit and not finished:
            self.manager.cancel_request(state.rid)
            finished = True
        if state.streaming:
            if new or finished:
                self._send(state, new, state.sent, final=finished)
                state.sent += len(new)
        elif finished:
            self._send(state, tokens, 0, final=True)
            state.sent = len(tokens)

    def _send(self, state, tokens, offset, final):
        """Send one response (tokens[offset:...] of the sequence); the sequence's last one retires it first,
        under the lock that also guards is_cancelled(): a response factory must never be touched after
        the request's final send. Only the last sequence of a request carries the FINAL flag. The prompt
        leads a non-streaming response when the request keeps exclude_input_in_output false (the C++
        backend's rule: a streamed response never repeats it)."""
        t0 = time.perf_counter()
        entry = self.table.get(state.handle)
        ids = list(tokens)
        if not state.exclude_input and not state.streaming and offset == 0:
            ids = state.prompt_ids + ids
        out = [pb_utils.Tensor("output_ids", np.asarray([ids], dtype=np.int32).reshape(1, 1, -1)),
               pb_utils.Tensor("sequence_length", np.asarray([[len(ids)]], dtype=np.int32)),
               pb_utils.Tensor("sequence_index", np.asarray([[state.seq_index]], dtype=np.int32)),
               pb_utils.Tensor("batch_index", np.asarray([[state.batch_index]], dtype=np.int32))]
        if state.log_probs and entry is not None:
            lps = entry.log_probs[offset:offset + len(tokens)]
            lps += [0.0] * (len(tokens) - len(lps))
            out += [pb_utils.Tensor("output_log_probs", np.asarray(lps, dtype=np.float32).reshape(1, 1, -1)),
                    pb_utils.Tensor("cum_log_probs", np.asarray([[sum(entry.log_probs[:offset + len(tokens)])]],
                                                                dtype=np.float32))]
        if state.gen_logits and entry is not None:  # [batch 1, beam 1, tokens of this response, vocab]
            rows = entry.logits[offset:offset + len(tokens)]
            logits = np.stack(rows).astype(np.float32) if rows else np.zeros((0, self.vocab_size), np.float32)
            out.append(pb_utils.Tensor("generation_logits", logits.reshape(1, 1, len(rows), -1)))
        if state.perf:
            out += _perf_tensors(self.output_dtypes, {
                "kv_cache_alloc_new_blocks": state.kv_blocks,
                "kv_cache_reused_blocks": 0,  # prefix reuse is not reported by the library
                "kv_cache_alloc_total_blocks": state.kv_blocks,
                "arrival_time_ns": state.arrival_ns, "first_scheduled_time_ns": state.first_scheduled_ns,
                "first_token_time_ns": state.first_token_ns, "last_token_time_ns": state.last_token_ns,
                "acceptance_rate": 0.0, "total_accepted_draft_tokens": 0, "total_draft_tokens": 0})  # no drafts
        with self.lock:
            if state.done or state.group.closed:
                return
            last = False
            if final:
                self._retire_locked(state)
                state.group.remaining -= 1
                last = state.group.remaining == 0
            response = pb_utils.InferenceResponse(output_tensors=out)
            t1 = time.perf_counter()
            if last:
                state.group.send_final(state.sender, response)
            else:
                state.sender.send(response)
            self.stats["responses_total"] += 1  # one writer: the thread that routes
            self.response_seconds["build"] += t1 - t0
            self.response_seconds["send"] += time.perf_counter() - t1

    def _retire_locked(self, state):
        """Mark a sequence finished and drop it from the tables (caller holds self.lock)."""
        state.done = True
        self.requests.pop(state.rid, None)
        self.table.drop(state.handle)
        self.stats["inflight"] -= 1
        if state.first_token_ns:
            self.stats["generating"] -= 1

    # ---- cancellation: a client that goes away frees its request's KV blocks -------------------
    def _cancel_loop(self):
        """Housekeeping every cancellation_check_period_ms: cancel the requests whose client went away
        (frees their KV blocks) and publish the metrics. `is_cancelled()` is a round trip to the
        server, so it is asked outside the lock that the dispatcher needs for every token."""
        while not self.stop_event.wait(self.cancel_period):
            with self.lock:
                live = [state for state in self.requests.values() if not state.done]
            gone = []
            for state in live:
                try:
                    if state.group.is_cancelled(state.sender):
                        gone.append(state)
                except Exception:
                    pass  # the request ended meanwhile
            with self.lock:
                for state in gone:
                    if not state.done:
                        self._cancel_locked(state, "request cancelled")
            self._publish()  # also refreshes the KV free-block gauge

    def finalize(self):
        self.stop_event.set()
        try:
            self.manager.stop(block=True, timeout=10)
        except TypeError:
            self.manager.stop(block=True)
        except Exception:
            pass
