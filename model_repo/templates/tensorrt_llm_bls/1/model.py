# The `tensorrt_llm_bls` model: preprocessing -> tensorrt_llm -> postprocessing through BLS calls
# (TensorRT-LLM backend interface: all_models/inflight_batcher_llm/tensorrt_llm_bls).
# Each client request runs in its own thread: the tokenizer is called once, tensorrt_llm is called
# with exec(decoupled=True) and every one of its responses is detokenized and sent on at once.
# A client that cancels stops the stream (and the tensorrt_llm request with it): a housekeeping thread
# asks every live request's sender every cancellation_check_period_ms (also while its tensorrt_llm
# request is queued and sends nothing) and forwards a cancellation as a `stop` request. At most PENDING_MAX
# tensorrt_llm calls wait for their first response at once, so that Triton's BLS threads stay free for stops
# and for the responses to clients. A client that asks for output_token_ids by name (beyond upstream's
# interface: model_repo.generate.BLS_OUTPUTS) gets, with each response, the token ids of the text it carries.

import json as _json
import os as _os
import sys as _sys

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import threading
import time
import uuid

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpipe_runtime.detokenize import IncrementalDetokenizer, StopMatcher
from trtpipe_runtime.params import param
from trtpipe_runtime.triton_io import ERROR_APART
from trtpipe_runtime.lifeline import STOPPING, draining, watch_parent

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# client tensor -> preprocessing tensor
PRE_INPUTS = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
              "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID",
              "embedding_bias_words": "EMBEDDING_BIAS_WORDS", "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS"}
# preprocessing output -> tensorrt_llm input
PRE_TO_LLM = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths", "REQUEST_OUTPUT_LEN": "request_output_len",
              "BAD_WORDS_IDS": "bad_words_list", "STOP_WORDS_IDS": "stop_words_list", "OUT_END_ID": "end_id",
              "OUT_PAD_ID": "pad_id", "EMBEDDING_BIAS": "embedding_bias"}


def _param(cfg, key):
    return param(cfg, key, "")


def _check_inputs(request):
    """ValueError naming a required input the request lacks (Triton checks required inputs only when the number
    of inputs is out of range, so an optional input sent instead of a required one reaches this model)."""
    missing = [n for n in ("text_input", "max_tokens") if pb_utils.get_input_tensor_by_name(request, n) is None]
    if missing:
        raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: send text_input "
                         "and max_tokens (the required inputs)")


STALL_S = 5.0
"""Seconds without a response from tensorrt_llm after which the BLS checks that its stub still lives."""
PENDING_MAX = 24
"""Most tensorrt_llm calls waiting for their first response at once. Triton's Python backend runs every BLS
call on a pool of 32 threads per instance (python_be.cc: thread_pool_size, `--backend-config=python,
thread-pool-size=N`), and a decoupled exec() holds its thread until the first response: with more waiting
calls than threads, the `stop` requests and the responses to clients queue behind them (cancellation stalled
at 50 streams). The other 8 threads stay free for those."""


class _Live:
    """One client request: its sender, the id of the tensorrt_llm request it started, and whether the
    client cancelled. ``lock`` guards the sender: the final send and is_cancelled() never overlap, and
    is_cancelled() is never asked after the final send (Triton 2.51's Python backend releases the
    response factory then; asking it crashes the server: server issues #8192, #8034)."""

    __slots__ = ("sender", "inner_id", "stream", "lock", "closed", "cancelled", "started", "stopped", "last", "asked")

    def __init__(self, sender, asked=None):
        self.last = time.monotonic()  # the last sign of life of the tensorrt_llm request (watchdog)
        self.sender, self.inner_id, self.stream = sender, uuid.uuid4().hex, None
        self.asked = asked  # the outputs the client asked for (None: unknown, send every one)
        self.lock, self.closed, self.cancelled = threading.Lock(), False, False
        self.started = self.stopped = False  # the tensorrt_llm request was sent / a stop was sent for it

    def claim_stop(self):
        """True for the one caller that forwards the cancellation (canceller or request thread), once the
        tensorrt_llm request was sent (exec() returns only with its first response: a queued request has
        no stream yet, so the stop goes by request id)."""
        with self.lock:
            first = self.started and not self.stopped
            self.stopped = self.stopped or first
            return first

    def send(self, response):
        with self.lock:
            if not self.closed:
                self.sender.send(response)

    def send_final(self, response=None):
        """The request's last response (once); later calls do nothing."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            if response is None:
                self.sender.send(flags=FINAL)
            else:
                self.sender.send(response, flags=FINAL)

    def poll_cancelled(self):
        """True once the client cancelled (asked of the server only while the request is open)."""
        with self.lock:
            if not self.closed and not self.cancelled and self.sender.is_cancelled():
                self.cancelled = True
        return self.cancelled


def _stop_strings(request) -> list:
    """The request's ``stop_strings`` (STRING [-1], this BLS model's own input: upstream's ``stop_words`` are token
    ids; these are matched on the decoded text, as OpenAI's ``stop``), empty ones dropped."""
    t = pb_utils.get_input_tensor_by_name(request, "stop_strings")
    if t is None:
        return []
    words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in t.as_numpy().reshape(-1)]
    return [w for w in words if w]


def _requested(request):
    """The output names the client's request asks for (every output when it names none), or None where the
    Python backend cannot say (no requested_output_names())."""
    try:
        return frozenset(request.requested_output_names())
    except Exception:
        return None


def _asks_for(request, name):
    """Whether the client asked for output ``name`` by name (the model sends output_token_ids only then)."""
    return name in (_requested(request) or ())


class TritonPythonModel:
    def initialize(self, args):
        watch_parent(f"the {args.get('model_name', 'model')} stub")  # ends when tritonserver does, even killed
        cfg = _json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        self.runtime_inputs = dict(pair.split(":") for pair in _param(cfg, "runtime_input_names").split(",") if pair)
        self.pass_outputs = [n for n in _param(cfg, "runtime_output_names").split(",") if n]
        self.live = {}  # thread -> _Live
        self.lock = threading.Lock()
        self.pending = threading.BoundedSemaphore(PENDING_MAX)
        self.stop_event = threading.Event()
        self.cancel_period = int(_param(cfg, "cancellation_check_period_ms") or "100") / 1000.0
        self.canceller = threading.Thread(target=self._cancel_loop, name="trtpipe-bls-cancel", daemon=True)
        self.canceller.start()

    def execute(self, requests):
        if not self.decoupled:
            return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                "tensorrt_llm_bls streams through decoupled responses: regenerate with serving.streaming: true"))
                for _ in requests]
        for request in requests:
            live = _Live(request.get_response_sender(), _requested(request))
            t = threading.Thread(target=self._run, args=(request, live), daemon=True)
            with self.lock:
                self.live[t] = live
            t.start()
        return None

    def _run(self, request, live):
        try:
            self._generate(request, live)
        except Exception as exc:  # every failure goes back to the client that caused it
            live.send_final(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))))
        finally:
            with self.lock:
                self.live.pop(threading.current_thread(), None)

    def _cancel_loop(self):
        """Every cancellation_check_period_ms: a request whose client cancelled gets its tensorrt_llm
        request stopped (its KV blocks freed), whether that request generates or still waits. And a
        watchdog: when a started request has shown no sign of life for STALL_S, tensorrt_llm is probed;
        if its stub died (Triton then never ends its in-flight requests) the client gets that error."""
        probed = 0.0
        while not self.stop_event.wait(self.cancel_period):
            with self.lock:
                live = list(self.live.values())
            for entry in live:
                try:
                    if entry.poll_cancelled() and entry.claim_stop():
                        self._stop(entry.inner_id, entry.stream)
                except Exception as exc:  # the request ended meanwhile
                    pb_utils.Logger.log_verbose(f"tensorrt_llm_bls: cancellation check: {exc}")
            now = time.monotonic()
            stalled = [e for e in live if e.started and not e.closed and now - e.last > STALL_S]
            if stalled and now - probed > STALL_S:
                probed = now
                dead = self._probe_dead()
                for entry in stalled if dead else ():
                    entry.send_final(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                        f"tensorrt_llm failed while this request was in flight: {dead}")))

    @staticmethod
    def _model_error():
        """What tensorrt_llm says when it cannot serve (its stub died: Triton's "not healthy"; its engine worker
        died: the runtime's reason), else None. The probe is a `stop` without a request id, which a live model
        refuses at once for the missing id."""
        error = None
        try:
            for resp in TritonPythonModel._stop_request(""):  # read to its end: an unread stream keeps this model
                if error is None and resp.has_error() and "needs the request_id" not in resp.error().message():
                    error = resp.error().message()  # from unloading, and tritonserver from stopping
        except Exception as exc:
            return str(exc)
        return error

    @staticmethod
    def _probe_dead():
        """tensorrt_llm's error when its stub died (Triton then never ends its in-flight requests), else None."""
        err = TritonPythonModel._model_error()
        return err if err and "not healthy" in err else None

    @staticmethod
    def _call(model, inputs, outputs):
        resp = pb_utils.InferenceRequest(model_name=model, inputs=inputs, requested_output_names=outputs).exec()
        if resp.has_error():
            raise RuntimeError(resp.error().message())
        return resp

    @staticmethod
    def _stop(inner_id, stream):
        """Stop the tensorrt_llm request this BLS request started: the response iterator's cancel() where
        the Python backend has it (not in Triton 2.51) and the iterator exists, else a `stop` request with
        the same request id (the TensorRT-LLM backend's way, which the pytorch runtime implements too, also
        for a request that has not reached it yet)."""
        if stream is not None and hasattr(stream, "cancel"):
            stream.cancel()
            return
        try:
            for _ in TritonPythonModel._stop_request(inner_id):
                pass
        except Exception as exc:  # a runtime without `stop`: the request runs to its end
            pb_utils.Logger.log_warn(f"tensorrt_llm_bls: could not stop {inner_id}: {exc}")

    @staticmethod
    def _stop_request(request_id):
        """The responses of a `stop` request for ``request_id`` to tensorrt_llm (an iterator)."""
        one = np.zeros((1, 1), dtype=np.int32)
        stop = [pb_utils.Tensor("input_ids", one), pb_utils.Tensor("input_lengths", one + 1),
                pb_utils.Tensor("request_output_len", one + 1), pb_utils.Tensor("stop", np.ones((1, 1), dtype=bool))]
        return pb_utils.InferenceRequest(model_name="tensorrt_llm", inputs=stop, request_id=request_id,
                                         requested_output_names=["output_ids"]).exec(decoupled=True)

    @staticmethod
    def _cancelled_response():
        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("request cancelled"))

    def _generate(self, request, live):
        if draining():  # tritonserver is about to stop (trtpipe_runtime.lifeline.drain)
            raise RuntimeError(STOPPING)
        _check_inputs(request)
        pre_in = [pb_utils.Tensor(dst, t.as_numpy()) for src, dst in PRE_INPUTS.items()
                  if (t := pb_utils.get_input_tensor_by_name(request, src)) is not None]
        pre = self._call("preprocessing", pre_in, list(PRE_TO_LLM))
        llm_in = [pb_utils.Tensor(dst, pb_utils.get_output_tensor_by_name(pre, src).as_numpy())
                  for src, dst in PRE_TO_LLM.items()]
        for src, dst in self.runtime_inputs.items():
            t = pb_utils.get_input_tensor_by_name(request, src)
            if t is not None:
                llm_in.append(pb_utils.Tensor(dst, t.as_numpy()))
        if not self._wait_pending(live):  # cancelled while waiting for a pending slot: nothing was started
            live.send_final(self._cancelled_response())
            return
        try:
            if live.poll_cancelled():  # cancelled while being tokenized: nothing was started
                live.send_final(self._cancelled_response())
                return
            with live.lock:
                live.started = True
            stream = pb_utils.InferenceRequest(  # a mid-stream error apart from the final flag (see ERROR_APART)
                model_name="tensorrt_llm", inputs=llm_in, request_id=live.inner_id, parameters={ERROR_APART: True},
                requested_output_names=["output_ids", "sequence_length"] + self.pass_outputs).exec(decoupled=True)
        finally:
            self.pending.release()
        n_t = pb_utils.get_input_tensor_by_name(request, "num_return_sequences")
        self._relay(stream, live, _asks_for(request, "output_token_ids"), _stop_strings(request),
                    int(n_t.as_numpy().reshape(-1)[0]) if n_t is not None else 1)

    def _wait_pending(self, live):
        """Take one of the PENDING_MAX slots (True), or False once the client cancelled while it waited."""
        while not self.pending.acquire(timeout=self.cancel_period):
            if live.poll_cancelled():
                return False
        return True

    def _relay(self, stream, live, token_ids=False, stops=(), n_seq=1):
        """Detokenize every response of the tensorrt_llm ``stream`` and send it to the client, until the end
        (``token_ids``: with output_token_ids, the ids of each one-sequence response's text). ``stops``: the
        request's stop_strings, matched on each sequence's text (StopMatcher): the text from the first one on is
        left out, and once every sequence (``n_seq``) has stopped the tensorrt_llm request is stopped."""
        live.stream = stream
        if live.cancelled and live.claim_stop():  # cancelled between the check above and the send
            self._stop(live.inner_id, stream)
        last_had_tokens = False
        detoks = {}  # sequence_index -> its IncrementalDetokenizer (a character split across responses is whole)
        matchers = {}  # sequence_index -> its StopMatcher (with stop_strings)
        ended_by_stop = False
        for resp in stream:
            if live.cancelled:
                live.send_final(self._cancelled_response())
                for _ in stream:  # read the inner stream to its final response (the stopped request's end):
                    pass          # a BLS model with an unread stream never unloads, so the server cannot stop
                return
            if resp.has_error():
                raise RuntimeError(resp.error().message())
            live.last = time.monotonic()
            ids = pb_utils.get_output_tensor_by_name(resp, "output_ids")
            last_had_tokens = ids is not None
            if ids is None:  # the empty final response of a decoupled stream
                continue
            lengths = pb_utils.get_output_tensor_by_name(resp, "sequence_length").as_numpy()
            passed = {name: t.as_numpy() for name in self.pass_outputs
                      if (t := pb_utils.get_output_tensor_by_name(resp, name)) is not None}
            tokens = ids.as_numpy()
            if tokens.ndim == 2:  # [beams, len] without the batch dim
                tokens = tokens[None]
            if tokens.shape[1] == 1:  # one sequence: its new ids continue the text sent so far
                seq = int(passed["sequence_index"].reshape(-1)[0]) if "sequence_index" in passed else 0
                detok = detoks.setdefault(seq, IncrementalDetokenizer(self._batch_decode))
                n = int(lengths.reshape(-1)[0])
                text = detok.push(tokens[0, 0, :n].tolist())
                if stops:
                    matcher = matchers.setdefault(seq, StopMatcher(stops))
                    if matcher.stopped:
                        continue  # tokens after its stop string, generated before the stop reached the runtime
                    text = matcher.push(text)
                texts, counts = [text.encode("utf-8")], [n]
                if token_ids:
                    passed["output_token_ids"] = np.ascontiguousarray(tokens[0, 0, :n], dtype=np.int32).reshape(1, n)
            elif stops:
                raise ValueError("stop_strings with beam_width > 1: beams are rewritten until the end, so a stop "
                                 "string cannot end one; send stop_words (token ids) or beam_width 1")
            else:  # beam search: every response carries each beam whole
                post = self._call("postprocessing", [pb_utils.Tensor("TOKENS_BATCH", tokens),
                                                     pb_utils.Tensor("SEQUENCE_LENGTH", lengths)],
                                  ["OUTPUT", "NUM_OUTPUT_TOKENS"])
                texts = pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy()
                counts = pb_utils.get_output_tensor_by_name(post, "NUM_OUTPUT_TOKENS").as_numpy()
            live.send(self._text_response(texts, counts, passed, live.asked))
            if stops and matchers and all(m.stopped for m in matchers.values()):
                if len(matchers) >= n_seq and live.claim_stop():  # every sequence stopped: free the runtime
                    self._stop(live.inner_id, stream)
                    ended_by_stop = True
        if not live.cancelled and not ended_by_stop and draining():  # tensorrt_llm ended it for a drain
            raise RuntimeError(STOPPING)
        if not last_had_tokens and not live.cancelled and not ended_by_stop:  # ended on an empty response: failed
            raise RuntimeError(self._why_ended())
        for seq, matcher in matchers.items():  # the text a possible stop string held back, at the end
            rest = matcher.flush()
            if rest and not live.cancelled:
                index = {"sequence_index": np.array([[seq]], dtype=np.int32)} if "sequence_index" in \
                    self.pass_outputs and len(matchers) > 1 else {}
                live.send(self._text_response([rest.encode("utf-8")], [0], index, live.asked))
        live.send_final(self._cancelled_response() if live.cancelled else None)


    @staticmethod
    def _text_response(texts, counts, passed, asked=None):
        """A response with the outputs the client asked for (``asked``; None: every one). Only those: Triton
        2.51's Python backend (r24.10) drops the others in the stub's ResponseSender::Send with the GIL released,
        and freeing their numpy arrays there kills the stub with SIGSEGV (seen under Python 3.12; fixed upstream
        in r24.12, python_backend #390)."""
        values = {"text_output": np.array(texts, dtype=object), "num_output_tokens": np.asarray(counts, dtype=np.int32),
                  **passed}
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, value) for name, value in
                                                          values.items() if asked is None or name in asked])

    def _batch_decode(self, windows):
        """Windows of token ids -> their texts, in one call of the postprocessing model (its tokenizer and its
        skip_special_tokens choice)."""
        width = max(1, max(len(w) for w in windows))
        tokens = np.zeros((len(windows), 1, width), dtype=np.int32)
        for i, w in enumerate(windows):
            tokens[i, 0, :len(w)] = w
        lengths = np.array([[len(w)] for w in windows], dtype=np.int32)
        post = self._call("postprocessing", [pb_utils.Tensor("TOKENS_BATCH", tokens),
                                             pb_utils.Tensor("SEQUENCE_LENGTH", lengths)], ["OUTPUT"])
        return [x.decode("utf-8") if isinstance(x, bytes) else str(x)
                for x in pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy().reshape(-1)]

    def _why_ended(self):
        """The reason a tensorrt_llm stream ended without its final tokens. Triton 2.51's Python backend does
        not hand a BLS caller an error sent mid-stream (only the end of the stream): ask tensorrt_llm."""
        msg = "the tensorrt_llm request ended without its final tokens (a failure; the server log says why)"
        err = self._model_error()
        return f"{err} ({msg})" if err else msg

    def finalize(self):
        self.stop_event.set()
        with self.lock:
            threads = list(self.live)
        for t in threads:
            t.join(timeout=5)
