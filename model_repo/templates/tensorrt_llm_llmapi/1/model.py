# The `tensorrt_llm` model for the `trtllm-llmapi` runtime (Triton Python backend).
#
# TensorRT-LLM's LLM API (`tensorrt_llm.LLM`, PyTorch backend) serves the ModelOpt unified HF
# checkpoint with in-flight batching and a paged KV cache. `execute` validates each request
# and schedules `LLM.generate_async(token_ids, SamplingParams, streaming=True)` on an asyncio
# loop in a background thread; each streamed `RequestOutput` is sent to the request's response
# sender (decoupled). Same tensors as the C++ backend: input_ids/input_lengths/
# request_output_len in, output_ids/sequence_length out (generated tokens only).

# @@BOOTSTRAP@@ (replaced at package time by templates/_bootstrap.py: sys.path set-up)

import asyncio
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# @@REQUEST_HELPERS@@ (replaced at package time by templates/_request_helpers.py)
PERF = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")


def _response(tokens, perf=None):
    out = [pb_utils.Tensor("output_ids", np.asarray([tokens], dtype=np.int32).reshape(1, -1)),
           pb_utils.Tensor("sequence_length", np.asarray([len(tokens)], dtype=np.int32))]
    for name, value in (perf or {}).items():
        out.append(pb_utils.Tensor(name, np.asarray([value], dtype=np.int64)))
    return pb_utils.InferenceResponse(output_tensors=out)


class TritonPythonModel:
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        try:
            from tensorrt_llm import LLM, SamplingParams
            from tensorrt_llm.llmapi import KvCacheConfig
        except ImportError as exc:
            raise pb_utils.TritonModelException(
                "runtime trtllm-llmapi needs TensorRT-LLM (tensorrt_llm.LLM) in the Python backend's interpreter: "
                f"{exc}. Serve this repository in the NGC Triton TRT-LLM container, or rebuild with "
                "runtime: pytorch for CPU/portable serving") from exc
        self.SamplingParams = SamplingParams
        self.max_input_len = int(_param(cfg, "max_input_len"))
        self.max_seq_len = int(_param(cfg, "max_seq_len"))
        kv = KvCacheConfig(free_gpu_memory_fraction=float(_param(cfg, "kv_cache_free_gpu_mem_fraction", "0.9")),
                           max_tokens=int(_param(cfg, "max_tokens_in_paged_kv_cache")),
                           enable_block_reuse=_param(cfg, "enable_kv_cache_reuse", "false") == "true")
        self.llm = LLM(model=_param(cfg, "gpt_model_path"), max_batch_size=int(_param(cfg, "max_batch_size")),
                       max_num_tokens=int(_param(cfg, "max_num_tokens")), max_seq_len=self.max_seq_len,
                       max_beam_width=int(_param(cfg, "max_beam_width", "1")), kv_cache_config=kv,
                       enable_chunked_prefill=_param(cfg, "enable_chunked_context", "false") == "true")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids = _prompt_ids(request)
                max_new = int(_opt_scalar(request, "request_output_len"))
                if len(ids) > self.max_input_len or len(ids) + max_new > self.max_seq_len:
                    raise ValueError(f"prompt {len(ids)} + request_output_len {max_new} exceeds max_input_len "
                                     f"{self.max_input_len} / max_seq_len {self.max_seq_len}")
                end_id = _opt_scalar(request, "end_id")
                params = self.SamplingParams(max_tokens=max_new, end_id=end_id,
                                             pad_id=_opt_scalar(request, "pad_id", end_id))
                streaming = bool(_opt_scalar(request, "streaming", False))
                perf = bool(_opt_scalar(request, "return_perf_metrics", False))
            except Exception as exc:  # a bad request fails alone
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
                continue
            asyncio.run_coroutine_threadsafe(self._generate(ids, params, streaming, perf, sender), self.loop)
        return None

    async def _generate(self, ids, params, streaming, perf, sender):
        times = {"arrival_time_ns": time.time_ns(), "first_scheduled_time_ns": 0, "first_token_time_ns": 0,
                 "last_token_time_ns": 0}
        try:
            tokens, sent = [], 0
            async for out in self.llm.generate_async(ids, sampling_params=params, streaming=True):
                new = list(out.outputs[0].token_ids_diff)
                now = time.time_ns()
                if new and not times["first_token_time_ns"]:
                    times["first_token_time_ns"] = times["first_scheduled_time_ns"] = now
                times["last_token_time_ns"] = now
                tokens += new
                if streaming and new and not out.finished:
                    sender.send(_response(new))
                    sent = len(tokens)
            # the last response carries what was not sent yet (everything when not streaming)
            sender.send(_response(tokens[sent:], times if perf else None), flags=FINAL)
        except Exception as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"generation failed: {exc}")),
                        flags=FINAL)

    def finalize(self):
        try:
            self.llm.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
