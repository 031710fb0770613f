# The unoptimized baseline `tensorrt_llm` model (benchmarks only; Triton Python backend).
#
# The naive way of serving a Hugging Face model: requests are collected into a static batch (up
# to max_batch_size, or whatever arrived within a short window after the first), left-padded to
# the longest prompt, and run with plain `model.generate` (a contiguous, per-batch KV cache, no
# paging) until the longest request of the batch is done. Nothing is streamed: each request gets
# one final response with all its tokens. Requests that arrive meanwhile wait for the next batch.
# Same tensors as the `pytorch` runtime, so the ensemble and the load tester do not change.

import json as _json
import os as _os

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import queue
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

from trtpipe_runtime.params import param as _param
from trtpipe_runtime.triton_io import FINAL, opt_scalar as _opt_scalar, prompt_ids as _prompt_ids


class TritonPythonModel:
    def initialize(self, args):
        import torch
        from transformers import AutoModelForCausalLM

        cfg = _json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(cfg)
        engine_dir = _param(cfg, "gpt_model_path")
        with open(_os.path.join(engine_dir, "engine.json")) as fh:
            bc = _json.load(fh)["build_config"]
        self.max_batch_size = int(_param(cfg, "max_batch_size", bc["max_batch_size"]))
        self.max_seq_len = int(_param(cfg, "max_seq_len", bc["max_seq_len"]))
        self.window_s = float(_param(cfg, "static_batch_window_ms", "20")) / 1000.0
        self.device = _param(cfg, "device", "cpu")
        dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[
            _param(cfg, "runtime_dtype", "float32")]
        self.model = AutoModelForCausalLM.from_pretrained(engine_dir, dtype=dtype, attn_implementation="sdpa")
        self.model.to(self.device).eval()
        self.vocab_size = int(self.model.config.vocab_size)
        with open(_os.path.join(engine_dir, "generation_config.json")) as fh:
            gen = _json.load(fh)
        eos = gen.get("eos_token_id")
        self.default_end_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
        self.pad_id = int(gen.get("pad_token_id", self.default_end_ids[0] if self.default_end_ids else 0))
        self.torch = torch
        self.pending = queue.Queue()
        self.stop_event = threading.Event()
        self.worker = threading.Thread(target=self._loop, name="trtpipe-static", daemon=True)
        self.worker.start()
        pb_utils.Logger.log_info(f"tensorrt_llm[static baseline]: {engine_dir}, batches of up to "
                                 f"{self.max_batch_size}, window {self.window_s * 1e3:.0f} ms")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids = _prompt_ids(request)
                n = len(ids)
                max_new = int(_opt_scalar(request, "request_output_len", 0))
                if n <= 0 or max_new <= 0 or n + max_new > self.max_seq_len:
                    raise ValueError(f"prompt {n} + max_tokens {max_new} must be >= 1 each and fit max_seq_len "
                                     f"{self.max_seq_len}")
                end_id = _opt_scalar(request, "end_id", None)
                item = {"ids": ids, "max_new": max_new, "sender": sender,
                        "end_ids": [int(end_id)] if end_id is not None else list(self.default_end_ids),
                        "perf": bool(_opt_scalar(request, "return_perf_metrics", False)),
                        "arrival_ns": time.time_ns()}
            except Exception as exc:
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                            flags=FINAL)
                continue
            self.pending.put(item)
        return None

    def _collect(self):
        first = self.pending.get(timeout=0.1)
        batch, deadline = [first], time.monotonic() + self.window_s
        while len(batch) < self.max_batch_size:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(self.pending.get(timeout=left))
            except queue.Empty:
                break
        return batch

    def _loop(self):
        while not self.stop_event.is_set():
            try:
                batch = self._collect()
            except queue.Empty:
                continue
            try:
                self._run(batch)
            except Exception as exc:
                for item in batch:
                    item["sender"].send(pb_utils.InferenceResponse(
                        output_tensors=[], error=pb_utils.TritonError(f"generation failed: {exc}")), flags=FINAL)

    def _run(self, batch):
        torch = self.torch
        from transformers import GenerationConfig

        scheduled = time.time_ns()
        width = max(len(b["ids"]) for b in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, b in enumerate(batch):  # left padding: every prompt ends at the same column
            ids[i, width - len(b["ids"]):] = torch.tensor(b["ids"])
            mask[i, width - len(b["ids"]):] = 1
        eos = sorted({e for b in batch for e in b["end_ids"] if 0 <= e < self.vocab_size})
        gcfg = GenerationConfig(max_new_tokens=max(b["max_new"] for b in batch), do_sample=False,
                                eos_token_id=eos or None, pad_token_id=self.pad_id)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      generation_config=gcfg)
        new = out[:, width:].tolist()
        done = time.time_ns()
        for b, toks in zip(batch, new):
            toks = toks[:b["max_new"]]
            for k, t in enumerate(toks):
                if t in b["end_ids"]:
                    toks = toks[:k]
                    break
            tensors = [pb_utils.Tensor("output_ids", np.asarray(toks, dtype=np.int32).reshape(1, 1, -1)),
                       pb_utils.Tensor("sequence_length", np.asarray([[len(toks)]], dtype=np.int32))]
            if b["perf"]:
                for name, value in (("arrival_time_ns", b["arrival_ns"]), ("first_scheduled_time_ns", scheduled),
                                    ("first_token_time_ns", done), ("last_token_time_ns", done)):
                    tensors.append(pb_utils.Tensor(name, np.asarray([[value]], dtype=np.int64)))
            b["sender"].send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL)

    def finalize(self):
        self.stop_event.set()
