# The `tensorrt_llm` model for the `trtllm-llmapi` runtime (Triton Python backend).
#
# TensorRT-LLM's LLM API (`tensorrt_llm.LLM`, PyTorch backend) serves the ModelOpt unified HF
# checkpoint with in-flight batching and a paged KV cache. `execute` validates each request
# and schedules `LLM.generate_async(token_ids, SamplingParams, streaming=True)` on an asyncio
# loop in a background thread; each streamed `RequestOutput` is sent to the request's response
# sender (decoupled). Same tensors as the C++ backend: input_ids/input_lengths/
# request_output_len in, output_ids/sequence_length out (generated tokens only, unless the request
# sends exclude_input_in_output false). The per-request decoding inputs the config declares
# (temperature, top_k/top_p, seed, penalties, min_tokens, log probs, num_return_sequences/beam_width,
# stop/bad words, num_top_logprobs) are mapped onto SamplingParams by request_params.py beside this file; each
# response names its sequence (sequence_index), and an option the runtime cannot honour fails that request only.
# Log probabilities go out as the portable runtime sends them: output_log_probs [1, 1, n] and cum_log_probs for
# return_log_probs, top_log_probs / top_token_ids [1, 1, n, k] for num_top_logprobs k (n: this response's tokens),
# read from CompletionOutput.logprobs (a dict {token id: Logprob} per token; tests/facts/trtllm_1_2_1/log_probs.json).
# LoRA: lora_task_id (UINT64 [1], the C++ backend's input, declared with lora.adapters) picks an adapter of the
# engine folder's lora/adapters.json, sent as generate_async(lora_request=LoRARequest(name, task id, path)); 0 or
# absent is the base model; an unknown id fails that request, naming the served ones.

import os as _os
import sys as _sys

from trtpipe_runtime.bootstrap import set_up_sys_path

set_up_sys_path(__file__)  # before numpy: this model's site-packages first (trtpipe_runtime/bootstrap.py)

import asyncio
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

import request_params
from trtpipe_runtime.params import param as _param
from trtpipe_runtime.triton_io import FINAL, opt_scalar as _opt_scalar, output_dtypes as _output_dtypes
from trtpipe_runtime.triton_io import perf_tensors as _perf_tensors, prompt_ids as _prompt_ids, words as _words
from trtpipe_runtime.versions import options_file
from trtpipe_runtime.lifeline import watch_parent


def _outputs(dtypes, tokens, seq_index=0, log_probs=None, cum_log_prob=None, perf=None, logits=None, top=None):
    """One response's output tensors; ``logits`` maps context_logits / generation_logits to float32 arrays when
    asked for; ``top`` is (log probabilities [n][k], token ids [n][k]) of this response's n tokens for
    num_top_logprobs k: top_log_probs float32 / top_token_ids int32 [batch 1, beam 1, n, k], the portable runtime's
    tensors."""
    out = [pb_utils.Tensor("output_ids", np.asarray(tokens, dtype=np.int32).reshape(1, 1, -1)),
           pb_utils.Tensor("sequence_length", np.asarray([[len(tokens)]], dtype=np.int32)),
           pb_utils.Tensor("sequence_index", np.asarray([[seq_index]], dtype=np.int32)),
           pb_utils.Tensor("batch_index", np.asarray([[0]], dtype=np.int32))]
    if log_probs is not None:
        out += [pb_utils.Tensor("output_log_probs", np.asarray(log_probs, dtype=np.float32).reshape(1, 1, -1)),
                pb_utils.Tensor("cum_log_probs", np.asarray([[cum_log_prob]], dtype=np.float32))]
    if top is not None:
        vals, ids = top
        k = len(vals[0]) if vals else 0
        out += [pb_utils.Tensor("top_log_probs", np.asarray(vals, dtype=np.float32).reshape(1, 1, len(vals), k)),
                pb_utils.Tensor("top_token_ids", np.asarray(ids, dtype=np.int32).reshape(1, 1, len(ids), k))]
    for name, arr in (logits or {}).items():  # context [1, prompt, vocab]; generation [1, 1, tokens, vocab]
        shape = (1, -1, arr.shape[-1]) if name == "context_logits" else (1, 1, -1, arr.shape[-1])
        out.append(pb_utils.Tensor(name, np.asarray(arr, dtype=np.float32).reshape(shape)))
    if perf:
        out += _perf_tensors(dtypes, perf)
    return out


def _perf_values(times, metrics):
    """The perf outputs: this model's wall-clock times (ns since the epoch) and, from the LLM API's
    ``CompletionOutput.request_perf_metrics`` (SamplingParams.return_perf_metrics), the KV-cache block counts and
    the speculative-decoding acceptance (zeros when the LLM returned none)."""
    kv = getattr(metrics, "kv_cache_metrics", None)
    spec = getattr(metrics, "speculative_decoding", None)
    return {**times,
            "kv_cache_alloc_new_blocks": int(getattr(kv, "num_new_allocated_blocks", 0) or 0),
            "kv_cache_reused_blocks": int(getattr(kv, "num_reused_blocks", 0) or 0),
            "kv_cache_alloc_total_blocks": int(getattr(kv, "num_total_allocated_blocks", 0) or 0),
            "acceptance_rate": float(getattr(spec, "acceptance_rate", 0.0) or 0.0),
            "total_accepted_draft_tokens": int(getattr(spec, "total_accepted_draft_tokens", 0) or 0),
            "total_draft_tokens": int(getattr(spec, "total_draft_tokens", 0) or 0)}


def _array(value):
    """A torch tensor (or None) from the LLM API as a float32 numpy array."""
    if value is None:
        return None
    return value.detach().float().cpu().numpy() if hasattr(value, "detach") else np.asarray(value, np.float32)


def _bias(request):
    """The embedding_bias input as a list of floats (None when absent)."""
    t = pb_utils.get_input_tensor_by_name(request, "embedding_bias")
    return None if t is None else [float(x) for x in t.as_numpy().reshape(-1)]


class TritonPythonModel:
    def initialize(self, args):
        watch_parent(f"the {args.get('model_name', 'model')} stub")  # ends when tritonserver does, even killed
        cfg = json.loads(args["model_config"])
        try:
            from tensorrt_llm import LLM, SamplingParams
        except ImportError as exc:
            raise pb_utils.TritonModelException(
                "runtime trtllm-llmapi needs TensorRT-LLM (tensorrt_llm.LLM) in the Python backend's interpreter: "
                f"{exc}. Serve this repository in the NGC Triton TRT-LLM container, or rebuild with "
                "runtime: pytorch for CPU/portable serving") from exc
        self.SamplingParams = SamplingParams
        self.max_input_len = int(_param(cfg, "max_input_len"))
        self.max_seq_len = int(_param(cfg, "max_seq_len"))
        self.max_beam_width = int(_param(cfg, "max_beam_width", "1"))
        self.max_batch_size = int(_param(cfg, "max_batch_size", "1"))
        self.exclude_input_default = _param(cfg, "exclude_input_in_output", "false") == "true"
        self.guided_backend = _param(cfg, "guided_decoding_backend", "")  # "": guided requests are refused
        self.output_dtypes = _output_dtypes(cfg)
        with open(_os.path.join(_param(cfg, "gpt_model_path"), "config.json")) as fh:  # the HF checkpoint's
            self.vocab_size = int(json.load(fh).get("vocab_size") or 0) or None
        # The LLM-API options the generator wrote beside this file (trtllm-serve reads the same file): parallel
        # sizes, limits, kv_cache_config, scheduler_config, cuda_graph_config, chunked prefill, speculative_config.
        import tensorrt_llm
        import yaml

        path = options_file(_os.path.dirname(_os.path.abspath(__file__)), tensorrt_llm.__version__)
        pb_utils.Logger.log_info(f"TensorRT-LLM {tensorrt_llm.__version__}: LLM-API options from {path}")
        with open(path) as fh:
            options = yaml.safe_load(fh) or {}
        # LoRA: lora_task_id -> LoRARequest from the engine folder's adapter table (request_params.lora_table)
        self.lora_table = request_params.lora_table(_param(cfg, "gpt_model_path"))
        if self.lora_table:
            try:
                from tensorrt_llm.llmapi import LoRARequest
            except ImportError:  # the module that defines it (tensorrt_llm/executor/request.py)
                from tensorrt_llm.executor.request import LoRARequest
            self.LoRARequest = LoRARequest
            pb_utils.Logger.log_info("LoRA adapters (lora_task_id: name): " + ", ".join(
                f"{t}: {name}" for t, (name, _) in sorted(self.lora_table.items())))
        self.llm = LLM(model=_param(cfg, "gpt_model_path"), **options)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                batch = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
                if batch.ndim == 2 and batch.shape[0] != 1:
                    raise ValueError(f"batch of {batch.shape[0]} in one request: this runtime takes one prompt per "
                                     "request (the in-flight batcher batches across requests)")
                ids = _prompt_ids(request)
                max_new = int(_opt_scalar(request, "request_output_len"))
                if len(ids) > self.max_input_len or len(ids) + max_new > self.max_seq_len:
                    raise ValueError(f"prompt {len(ids)} + request_output_len {max_new} exceeds max_input_len "
                                     f"{self.max_input_len} / max_seq_len {self.max_seq_len}")
                opts = request_params.request_options(
                    lambda name: _opt_scalar(request, name, None), max_new_tokens=max_new,
                    max_beam_width=self.max_beam_width, max_batch_size=self.max_batch_size,
                    stop_words=_words(request, "stop_words_list"), bad_words=_words(request, "bad_words_list"),
                    decode=self._decode, exclude_input_default=self.exclude_input_default,
                    embedding_bias=_bias(request), vocab_size=self.vocab_size)
                streaming = bool(_opt_scalar(request, "streaming", False))
                if streaming and opts.beam_search:
                    raise request_params.RequestOptionError(
                        "beam_width > 1 with streaming: beams are reordered until the end, so this runtime "
                        "returns them only when finished; send stream false")
                sampling = dict(opts.sampling)
                if opts.embedding_bias is not None:
                    import torch

                    sampling["embedding_bias"] = torch.tensor(opts.embedding_bias, dtype=torch.float32)
                perf = bool(_opt_scalar(request, "return_perf_metrics", False))
                if perf:  # the LLM attaches request_perf_metrics (KV blocks, draft acceptance) to each output
                    sampling["return_perf_metrics"] = True
                if opts.guided is not None and not self.guided_backend:
                    raise request_params.RequestOptionError(
                        "guided_decoding_guide_type: guided decoding is off in this build (serving."
                        "guided_decoding_backend: null); rebuild with it set, or send no guide")
                if opts.guided is not None:  # the LLM was created with guided_decoding_backend (llm_api_options.yaml)
                    from tensorrt_llm.sampling_params import GuidedDecodingParams

                    sampling["guided_decoding"] = GuidedDecodingParams(**opts.guided)
                params = self.SamplingParams(**sampling)
                adapter = request_params.lora_adapter(_opt_scalar(request, "lora_task_id", None),
                                                      getattr(self, "lora_table", {}))
                lora = self.LoRARequest(*adapter) if adapter else None  # (lora_name, lora_int_id, lora_path)
            except Exception as exc:  # a bad request fails alone
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
                continue
            asyncio.run_coroutine_threadsafe(self._generate(ids, params, opts, streaming, perf, sender, lora),
                                             self.loop)
        return None

    def _decode(self, token_ids):
        tok = getattr(self.llm, "tokenizer", None)
        if tok is None:
            raise request_params.RequestOptionError("multi-token stop/bad words need the model's tokenizer, which "
                                                    "the LLM did not load: send one-token words")
        return tok.decode(token_ids)

    async def _generate(self, ids, params, opts, streaming, perf, sender, lora=None):
        times = {"arrival_time_ns": time.time_ns(), "first_scheduled_time_ns": 0, "first_token_time_ns": 0,
                 "last_token_time_ns": 0}
        n = opts.num_sequences
        tokens, lps, sent = [[] for _ in range(n)], [[] for _ in range(n)], [0] * n
        entries = [[] for _ in range(n)]  # CompletionOutput.logprobs so far, for num_top_logprobs
        cum = [0.0] * n
        gen_logits, ctx_logits = [None] * n, None
        metrics = [None] * n

        def send(i, final, flags=0):
            chunk = tokens[i][sent[i]:]
            # the prompt leads a non-streaming answer unless excluded; a streamed one never (as the C++ backend)
            if not opts.exclude_input and not streaming and sent[i] == 0:
                chunk = list(ids) + chunk
            chunk_lps = lps[i][sent[i]:] if opts.return_log_probs else None
            logits = {}
            if opts.context_logits and sent[i] == 0 and ctx_logits is not None:
                logits["context_logits"] = ctx_logits
            if opts.generation_logits and gen_logits[i] is not None:
                logits["generation_logits"] = gen_logits[i][sent[i]:len(tokens[i])]
            top = None
            if opts.num_top_logprobs:  # this response's generated tokens only (a prompt it leads with has none)
                top = request_params.top_log_probs(entries[i][sent[i]:len(tokens[i])], len(tokens[i]) - sent[i],
                                                   opts.num_top_logprobs)
            # `out` stays referenced until the send returns: Triton 2.51's stub (r24.10) drops the outputs a request
            # did not ask for with the GIL released, which frees them unless another reference holds them
            # (python_backend #390, fixed in r24.12)
            out = _outputs(self.output_dtypes, chunk, i, chunk_lps, cum[i],
                           _perf_values(times, metrics[i]) if perf and final else None, logits, top)
            sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=flags)
            sent[i] = len(tokens[i])

        try:
            # Streamed from the LLM even when the client does not stream (first-token times for perf
            # metrics); beam search is not, its beams are final only at the end.
            extra = {"lora_request": lora} if lora is not None else {}  # the base model: no LoRARequest at all
            async for out in self.llm.generate_async(ids, sampling_params=params, streaming=not opts.beam_search,
                                                     **extra):
                now = time.time_ns()
                if opts.context_logits and ctx_logits is None:  # RequestOutput.context_logits: [prompt, vocab]
                    ctx_logits = _array(getattr(out, "context_logits", None))
                for i, seq in enumerate(out.outputs[:n]):
                    index = getattr(seq, "index", i)
                    i = index if 0 <= index < n else i
                    if opts.beam_search:  # beams change until the end: keep the latest full sequence
                        tokens[i] = list(seq.token_ids)
                        new = tokens[i]
                    else:
                        new = list(seq.token_ids_diff)
                        tokens[i] += new
                    if opts.num_top_logprobs:
                        entries[i] = list(seq.logprobs or [])
                    if opts.return_log_probs:
                        lps[i] = request_params.sampled_log_probs(seq.logprobs, tokens[i])
                        cum[i] = float(getattr(seq, "cumulative_logprob", None) or sum(lps[i]))
                    metrics[i] = getattr(seq, "request_perf_metrics", None) or metrics[i]
                    if opts.generation_logits:  # CompletionOutput.generation_logits: [tokens so far, vocab]
                        gen_logits[i] = _array(getattr(seq, "generation_logits", None))
                    if new and not times["first_token_time_ns"]:
                        times["first_token_time_ns"] = times["first_scheduled_time_ns"] = now
                    times["last_token_time_ns"] = now
                    if streaming and new and not out.finished:
                        send(i, final=False)
            # each sequence's last response carries what was not sent yet (everything when not
            # streaming); the request's very last one is FINAL
            for i in range(n):
                send(i, final=True, flags=FINAL if i == n - 1 else 0)
        except Exception as exc:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"generation failed: {exc}")),
                        flags=FINAL)

    def finalize(self):
        try:
            self.llm.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
