"""Delivery of the portable runtime's `tensorrt_llm` model: each generation step's outputs routed to their
requests' response senders (a dispatcher thread, the generation thread itself, or the engine process's receiver),
end ids and stop words applied, responses built in the config's dtypes, and a request retired once its last
sequence has sent FINAL."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpipe_runtime.triton_io import FINAL, perf_tensors as _perf_tensors


class _Group:
    """The sequences of one Triton request (num_return_sequences): the last one to finish sends FINAL.

    The final send and the canceller's is_cancelled() take this group's lock: Triton's Python backend
    (2.51) releases a response factory after its final response, and an is_cancelled() that reaches a
    released one crashes the server (TRITONBACKEND_ResponseFactoryIsCancelled; server issues #8192, #8034)."""

    __slots__ = ("remaining", "closed", "lock", "error_apart")

    def __init__(self, n, error_apart=False):
        self.remaining = n
        self.closed = False
        self.lock = threading.Lock()
        self.error_apart = error_apart  # the caller is tensorrt_llm_bls (ERROR_APART): see send_final

    def send_final(self, sender, response=None):
        """Send the request's FINAL response unless one was sent; True when this call sent it."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            if response is None:
                sender.send(flags=FINAL)
            elif response.has_error() and self.error_apart:
                # to tensorrt_llm_bls (Triton 2.51) a mid-stream error is lost, with FINAL or without, and one sent
                # without leaves that model unable to unload: the bare FINAL ends its stream empty, and the BLS asks
                # tensorrt_llm why. The ensemble must get error and FINAL together: apart, its request is never
                # released, and tritonserver waits out its exit timeout at stop and crashes (SIGSEGV)
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



class Delivery:
    """The output routing of TritonPythonModel (mixed in: its lock, request table and stats are the model's)."""

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
        if entry is not None and (entry.params.num_top_logprobs or entry.prompt is not None):
            out += _log_prob_tensors(entry, offset, len(tokens))
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
            # `out` stays referenced until the send returns: Triton 2.51's stub drops the outputs a request did not
            # ask for with the GIL released, which is safe only while another reference holds their arrays
            # (python_backend #390; tensorrt_llm_bls's _text_response sends only the asked ones)
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



def _log_prob_tensors(entry, offset, n):
    """The log-prob outputs beyond upstream's interface of one response (tokens offset ... offset + n of the
    sequence): top_log_probs / top_token_ids [batch 1, beam 1, n, k] for num_top_logprobs k, and, once (the
    sequence's first response), prompt_log_probs [1, prompt - 1] with prompt_top_log_probs / prompt_top_token_ids
    [1, prompt - 1, k] (sampling.Entry.top and .prompt)."""
    k = entry.params.num_top_logprobs
    out = []
    if k:
        rows = entry.top[offset:offset + n]
        rows += [([float("-inf")] * k, [-1] * k)] * (n - len(rows))  # not recorded (never seen): no alternatives
        out += [pb_utils.Tensor("top_log_probs", np.asarray([r[0] for r in rows], np.float32).reshape(1, 1, n, k)),
                pb_utils.Tensor("top_token_ids", np.asarray([r[1] for r in rows], np.int32).reshape(1, 1, n, k))]
    if entry.prompt is not None:
        lps, top_lps, top_ids = entry.prompt
        entry.prompt = None
        out.append(pb_utils.Tensor("prompt_log_probs", np.asarray(lps, np.float32).reshape(1, -1)))
        if k:
            out += [pb_utils.Tensor("prompt_top_log_probs", np.asarray(top_lps, np.float32).reshape(1, len(lps), k)),
                    pb_utils.Tensor("prompt_top_token_ids", np.asarray(top_ids, np.int32).reshape(1, len(lps), k))]
    return out
