"""A streaming client for the ensemble (tritonclient gRPC).

``stream_generate`` sends one request through ``ensemble`` over a gRPC stream and yields
:class:`Chunk` objects as responses arrive; ``format_chat`` applies the model's chat
template (from the engine folder's tokenizer) so ``trtpipe query`` can send a chat turn.
Request errors (bad prompt, limits) arrive as :class:`RequestFailed` with the server's message.
"""

from __future__ import annotations

import queue
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from plugins.errors import PipelineError
from trtpipe_runtime.detokenize import Utf8Joiner


class RequestFailed(PipelineError):
    """The server answered the request with an error (message from the server)."""


@dataclass
class Chunk:
    """One streamed response.

    Attributes:
        text: decoded text of this response's tokens.
        num_tokens: tokens carried by this response (counted by the server).
        final: whether this is the request's last response.
        t: client receive time (``time.perf_counter()``, seconds).
        perf: server perf metrics (ns since the epoch) when requested.
    """

    text: str
    num_tokens: int
    final: bool
    t: float
    perf: dict | None = None
    outputs: dict | None = None


def format_chat(tokenizer_dir: Path, prompt: str, system: str | None = None, *, trust_remote_code: bool = False) -> str:
    """Render one user turn with the model's chat template (generation prompt appended); ``trust_remote_code`` is
    the build file's model.trust_remote_code (whether the tokenizer's own code may run)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True, trust_remote_code=trust_remote_code)
    if not tok.chat_template:
        return prompt
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


UINT64_INPUTS = ("seed", "lora_task_id")
"""The integer inputs the models declare UINT64 (the rest are INT32)."""


def build_inputs(text: str, max_tokens: int, *, stream: bool = True, end_id: int | None = None,
                 perf_metrics: bool = False, stop_words: list[str] | None = None, extra: dict | None = None):
    """tritonclient gRPC InferInput list for the ensemble (batch dim 1).

    ``extra`` maps further optional ensemble inputs to scalars (dtype from the value: bool,
    int -> INT32 (``seed`` and ``lora_task_id`` -> UINT64, as the ensemble declares them), float -> FP32, str -> BYTES (UTF-8; the
    guided-decoding guide), a list of str -> BYTES [1, n] (tensorrt_llm_bls's stop_strings)).
    """
    import tritonclient.grpc as grpcclient

    def tensor(name, arr, dtype):
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    inputs = [tensor("text_input", np.array([[text.encode()]], dtype=object), "BYTES"),
              tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
              tensor("stream", np.array([[stream]], dtype=bool), "BOOL")]
    if end_id is not None:
        inputs.append(tensor("end_id", np.array([[end_id]], dtype=np.int32), "INT32"))
    if perf_metrics:
        inputs.append(tensor("return_perf_metrics", np.array([[True]], dtype=bool), "BOOL"))
    if stop_words:
        inputs.append(tensor("stop_words", np.array([[w.encode() for w in stop_words]], dtype=object), "BYTES"))
    for name, value in (extra or {}).items():
        if isinstance(value, bool):
            inputs.append(tensor(name, np.array([[value]], dtype=bool), "BOOL"))
        elif isinstance(value, str):
            inputs.append(tensor(name, np.array([[value.encode("utf-8")]], dtype=object), "BYTES"))
        elif isinstance(value, (list, tuple)):  # strings, one row: tensorrt_llm_bls's stop_strings
            inputs.append(tensor(name, np.array([[str(v).encode("utf-8") for v in value]], dtype=object), "BYTES"))
        elif name in UINT64_INPUTS:
            inputs.append(tensor(name, np.array([[value]], dtype=np.uint64), "UINT64"))
        elif isinstance(value, int):
            inputs.append(tensor(name, np.array([[value]], dtype=np.int32), "INT32"))
        else:
            inputs.append(tensor(name, np.array([[value]], dtype=np.float32), "FP32"))
    return inputs


def stream_request(model: str, request_id: str, inputs: list, outputs: list):
    """The ModelInferRequest proto for a gRPC stream, asking for an empty final response (so the client knows the
    last one). The aio client's ``stream_infer`` cannot ask for it (the ``triton_`` parameter prefix is reserved
    there), so callers open the stream on the client's stub with this proto: the only private tritonclient API
    the project uses (``_get_inference_request``, tritonclient's own request builder)."""
    from tritonclient.grpc._utils import _get_inference_request

    req = _get_inference_request(model_name=model, inputs=inputs, model_version="", request_id=request_id,
                                 outputs=outputs, sequence_id=0, sequence_start=False, sequence_end=False, priority=0,
                                 timeout=None, parameters=None)
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    return req


PERF_NAMES = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
              "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns",
              "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
"""The outputs of a request with return_perf_metrics (model_repo.generate.PERF_OUTPUTS declares them with the
backend's dtypes; a test checks the two lists agree)."""


def stream_generate(url: str, text: str, max_tokens: int, *, model: str = "ensemble", timeout_s: float = 300.0,
                    perf_metrics: bool = False, extra_outputs: tuple[str, ...] = (), **kwargs) -> Iterator[Chunk]:
    """Send one request and yield its responses as they arrive.

    Args:
        url: gRPC ``host:port``.
        text: the prompt (already chat-formatted if wanted).
        max_tokens: most tokens to generate.
        model: Triton model name (``ensemble``).
        timeout_s: give up when no response arrives for this long.
        perf_metrics: ask for server-side timings.
        extra_outputs: further ensemble outputs to return in ``Chunk.outputs`` (e.g. sequence_index,
            output_log_probs), as numpy arrays, when a response carries them.
        **kwargs: passed to :func:`build_inputs`.

    Raises:
        RequestFailed: the server answered with an error.
        PipelineError: the server is unreachable or timed out.
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    outputs = [grpcclient.InferRequestedOutput("text_output"), grpcclient.InferRequestedOutput("num_output_tokens")]
    if perf_metrics:
        outputs += [grpcclient.InferRequestedOutput(n) for n in PERF_NAMES]
    outputs += [grpcclient.InferRequestedOutput(n) for n in extra_outputs]
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:  # start_stream succeeds even with nothing listening: ask the server first
        live = client.is_server_live()
    except InferenceServerException:
        live = False
    if not live:
        client.close()
        raise PipelineError(f"cannot reach Triton at {url}: is the server running (`trtpipe serve`)?")
    try:
        client.start_stream(callback=lambda result, error: q.put((result, error, time.perf_counter())))
    except InferenceServerException as exc:
        raise PipelineError(f"cannot reach Triton at {url}: {exc}. Is the server running (`trtpipe serve`)?") from exc
    finished = False
    joiner = Utf8Joiner()  # a character split across responses comes out whole
    try:
        client.async_stream_infer(model, build_inputs(text, max_tokens, perf_metrics=perf_metrics, **kwargs),
                                  request_id=uuid.uuid4().hex, outputs=outputs, enable_empty_final_response=True)
        while True:
            try:
                result, error, t = q.get(timeout=timeout_s)
            except queue.Empty:
                raise PipelineError(f"no response from {url} for {timeout_s:.0f} s") from None
            if error is not None:
                raise RequestFailed(str(error.message() if hasattr(error, "message") else error))
            resp = result.get_response()
            final = bool(resp.parameters.get("triton_final_response").bool_param) \
                if "triton_final_response" in resp.parameters else False
            arr = result.as_numpy("text_output")
            cnt = result.as_numpy("num_output_tokens")
            text_out = "" if arr is None or arr.size == 0 else joiner.push(b"".join(
                x if isinstance(x, bytes) else str(x).encode() for x in arr.reshape(-1)))
            if final:
                text_out += joiner.flush()
            n = 0 if cnt is None or cnt.size == 0 else int(cnt.reshape(-1).sum())
            perf = None
            if perf_metrics and arr is not None:
                perf = {k: v.reshape(-1)[0].item() for k in PERF_NAMES if (v := result.as_numpy(k)) is not None}
            extra = {k: v for k in extra_outputs if (v := result.as_numpy(k)) is not None} if extra_outputs else None
            if arr is not None or final:
                yield Chunk(text_out, n, final, t, perf, extra)
            if final:
                finished = True
                return
    finally:
        # Cancel only a request that has not ended: a cancel racing the final response can crash tritonserver
        # (the race of triton-inference-server/server #8034); a finished stream just closes.
        client.stop_stream(cancel_requests=not finished)
        client.close()
