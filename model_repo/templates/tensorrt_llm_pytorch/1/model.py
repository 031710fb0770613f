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
#
# This file is the model's lifecycle, intake and housekeeping; beside it: request_parsing.py (a request's
# inputs -> validated rows), delivery.py (per-step outputs -> responses), engine_proxy.py (the engine
# process's stub side), engine_worker.py (the generation loop), sampling.py (per-request decoding), log_probs.py
# (the prompt's log probabilities: one forward pass of the prompt, for return_prompt_log_probs).

import json as _json
import os as _os

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import collections
import threading
import time
import uuid

import triton_python_backend_utils as pb_utils

import engine_worker as engine
import sampling
from delivery import Delivery, _Group, _Request
from engine_proxy import _EngineProcess
from request_parsing import RequestError, RequestParsing
from trtpipe_runtime.params import choice, param as _param
from trtpipe_runtime.runtime_config import runtime_settings
from trtpipe_runtime.triton_io import ERROR_APART, FINAL, opt_scalar as _opt_scalar, output_dtypes as _output_dtypes
from trtpipe_runtime.lifeline import STOPPING, watch_drain, watch_parent

QUIET_S = 0.5
"""Seconds after a drain began, and without a new request, after which it is acknowledged (at most ten times as
long): time for tensorrt_llm_bls to relay the ends to its clients."""

EARLY_STOP_S = 60.0
"""How long a `stop` that matched no request is kept for a request with its id that arrives later."""


def _error_apart(request) -> bool:
    """Whether the request carries the parameter ERROR_APART = true (tensorrt_llm_bls sets it)."""
    try:
        return _json.loads(request.parameters() or "{}").get(ERROR_APART) is True
    except (ValueError, AttributeError):
        return False


class TritonPythonModel(RequestParsing, Delivery):
    def initialize(self, args):
        # this stub (and its engine worker) end when tritonserver does, even a killed one (trtpipe_runtime.lifeline)
        watch_parent(f"the {args.get('model_name', 'model')} stub", on_gone=self._end_worker)
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
        self.lora_names = info.get("lora") or {}  # lora_task_id -> adapter name (the build's lora.adapters)
        self.exclude_input_default = _param(cfg, "exclude_input_in_output", "false") == "true"
        self.guided_backend = _param(cfg, "guided_decoding_backend", "")  # "" : guided requests are refused
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
        self.stopping = None  # STOPPING once tritonserver shuts down
        self.last_arrival = 0.0  # time.monotonic() of the last execute()
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
        # `trtpipe stop` (or a preStop hook) asks for requests in flight to end before it sends SIGTERM
        watch_drain(self._server_stopping)

    def _server_stopping(self):
        """tritonserver is about to stop (lifeline's drain): end every request in flight with :data:`STOPPING`
        (their KV blocks freed) and refuse new ones, so that it exits at once and cleanly on its SIGTERM."""
        with self.lock:
            self.stopping = STOPPING
            for state in [s for s in self.requests.values() if not s.done]:
                self._cancel_locked(state, STOPPING)  # the BLS's end empty: it sees the drain, tells its client why
        pb_utils.Logger.log_warn("tensorrt_llm[pytorch]: tritonserver is stopping: requests in flight ended, new ones "
                                 "refused")
        # return (the drain's acknowledgement) once no request came for QUIET_S: tensorrt_llm_bls asks here why
        # each stream ended, and a BLS call still in flight at SIGTERM keeps that model from unloading
        start = time.monotonic()
        while time.monotonic() - start < 10 * QUIET_S and time.monotonic() - max(self.last_arrival, start) < QUIET_S:
            time.sleep(QUIET_S / 10)

    def _end_worker(self):
        """When tritonserver is gone (lifeline's thread, before this stub exits): kill the engine worker now rather
        than let it notice its parent's exit."""
        proc = getattr(getattr(self, "manager", None), "proc", None)
        if proc is not None:
            proc.kill()

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
        if not self.engine_process:  # (the engine worker waits for its own loop before it says ready)
            try:
                engine.await_loop(self.manager)
            except RuntimeError as exc:
                raise pb_utils.TritonModelException(f"tensorrt_llm: {exc}") from exc
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
        self.last_arrival = time.monotonic()
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
        if sender is not None:  # error and final together, also for the BLS: apart, its first response is lost
            sender.send(response, flags=FINAL)
        else:
            raise pb_utils.TritonModelException(message)

    def _enqueue(self, request, sender):
        if getattr(self.manager, "dead", None):  # also for `stop`: tensorrt_llm_bls asks why a stream ended
            raise RequestError(self.manager.dead)
        if bool(_opt_scalar(request, "stop", False)):
            self._stop(request, sender)
            return
        if self.stopping:
            raise RequestError(self.stopping)
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
            raise RequestError("return_context_logits = true: the pytorch runtime does not return the prompt's logits "
                               "(vocab x prompt floats; transformers' continuous batching computes logits at the last "
                               "prompt position only): drop it, and send return_prompt_log_probs true (with "
                               "num_top_logprobs k for the k most likely tokens) for the prompt's log probabilities")
        ids_t = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
        ids_t = ids_t.reshape(1, -1) if ids_t.ndim == 1 else ids_t
        batch = ids_t.shape[0]
        # Every entry of a batched request (the ensemble's text_input [B, 1]) is its own sequence; each response
        # names it in batch_index, as the C++ backend splits a batch into requests (one sender for all).
        rows = [self._parse_row(request, ids_t, b, batch) for b in range(batch)]
        if not self.engine_process:  # the grammar compiles here, where the loop runs (the worker does its own)
            for row in rows:
                engine.compile_guide(self.table, row["params"])
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
        prompts = [self._score_prompt(row) for row in rows]  # before any sequence is registered (it may raise)
        group = _Group(n_total, error_apart=_error_apart(request))
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
                if prompts[b] is not None:
                    self.table.get(handle).prompt = prompts[b]
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
                why = engine.loop_failure(self.manager) or "stopping or queue full"  # (None for the proxy)
            if added is None:
                with self.lock:
                    for other in states:
                        if not other.done:
                            self._retire_locked(other)
                for other in states:
                    self.manager.cancel_request(other.rid)
                raise RequestError(f"the runtime is not accepting requests ({why}): retry later")

    def _score_prompt(self, row):
        """With engine_process false, the prompt log probabilities a row asks for (return_prompt_log_probs: one
        forward pass here, log_probs.py), else None (the engine worker scores the prompt itself)."""
        params = row["params"]
        if self.engine_process or not params.return_prompt_log_probs:
            return None
        try:
            return self.table.prompts.get(row["ids"], params.num_top_logprobs, params.lora_task_id).as_tuple()
        except Exception as exc:
            raise RequestError(f"return_prompt_log_probs: scoring the prompt failed: {type(exc).__name__}: "
                               f"{exc}") from exc

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
