# Trivial streaming model (Triton Python backend, decoupled): the ensemble's tensors with no
# compute. execute() only enqueues; one worker thread steps over every active request like an
# in-flight batcher, sending one dummy token per request per step, so concurrent requests
# interleave instead of queueing behind each other. An optional per-step delay (token_delay_us)
# gives the stream a pace; 0 means as fast as the server can send.

import json as _json
import os as _os
import sys as _sys

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import queue
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpipe_runtime.triton_io import FINAL, opt_scalar as _scalar, output_dtypes as _output_dtypes
from trtpipe_runtime.triton_io import perf_tensors as _perf_tensors
from trtpipe_runtime.lifeline import watch_parent


class _State:
    __slots__ = ("sender", "left", "perf", "arrival", "first_token", "scheduled")

    def __init__(self, sender, left, perf):
        self.sender, self.left, self.perf = sender, left, perf
        self.arrival = time.time_ns()
        self.scheduled = 0
        self.first_token = 0


class TritonPythonModel:
    def initialize(self, args):
        watch_parent(f"the {args.get('model_name', 'model')} stub")  # ends when tritonserver does, even killed
        cfg = _json.loads(args["model_config"])
        self.output_dtypes = _output_dtypes(cfg)
        value = cfg.get("parameters", {}).get("token_delay_us", {}).get("string_value", "0")
        self.delay = max(0, int(value or 0)) / 1e6
        self.incoming = queue.Queue()
        self.stop = threading.Event()
        self.worker = threading.Thread(target=self._loop, name="trivial-stream", daemon=True)
        self.worker.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            max_tokens = int(_scalar(request, "max_tokens", 0))
            if max_tokens < 1:
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"max_tokens must be >= 1, got {max_tokens}")),
                    flags=FINAL)
                continue
            self.incoming.put(_State(sender, max_tokens, bool(_scalar(request, "return_perf_metrics", False))))
        return None

    def _outputs(self, st):
        """This step's output tensors for ``st``: one `` tok`` token, and the perf outputs when asked for."""
        now = time.time_ns()
        st.first_token = st.first_token or now
        out = [pb_utils.Tensor("text_output", np.array([b" tok"], dtype=object)),
               pb_utils.Tensor("num_output_tokens", np.array([1], dtype=np.int32))]
        if st.perf:  # no KV cache, no drafts: the counts are 0
            out += _perf_tensors(self.output_dtypes, {
                "arrival_time_ns": st.arrival, "first_scheduled_time_ns": st.scheduled,
                "first_token_time_ns": st.first_token, "last_token_time_ns": now, "kv_cache_alloc_new_blocks": 0,
                "kv_cache_reused_blocks": 0, "kv_cache_alloc_total_blocks": 0, "acceptance_rate": 0.0,
                "total_accepted_draft_tokens": 0, "total_draft_tokens": 0})
        return out

    def _loop(self):
        active = []
        while not self.stop.is_set():
            try:
                block = not active
                while True:
                    st = self.incoming.get(timeout=0.05) if block else self.incoming.get_nowait()
                    st.scheduled = time.time_ns()
                    active.append(st)
                    block = False
            except queue.Empty:
                pass
            still = []
            for st in active:
                try:
                    if st.sender.is_cancelled():
                        st.sender.send(flags=FINAL)
                        continue
                    st.left -= 1
                    # `out` stays referenced until the send returns: Triton 2.51's stub drops the outputs a request
                    # did not ask for with the GIL released, which frees them (SIGSEGV) unless another reference
                    # holds them (python_backend #390); the load tester asks for num_output_tokens alone
                    out = self._outputs(st)
                    st.sender.send(pb_utils.InferenceResponse(output_tensors=out))
                    if st.left == 0:
                        st.sender.send(flags=FINAL)
                    else:
                        still.append(st)
                except Exception as exc:  # a broken sender must not stop the loop
                    pb_utils.Logger.log_error(f"trivial_stream: send failed: {exc}")
            active = still
            if self.delay and active:
                time.sleep(self.delay)

    def finalize(self):
        self.stop.set()
        self.worker.join(timeout=5)
