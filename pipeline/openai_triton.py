"""The OpenAI frontend's Triton side: one prompt -> the BLS model's streamed responses, over gRPC.

One job: send one generation request on its own aio gRPC stream (tokenize, generate, detokenize, as the ensemble;
the runtime batches requests in flight) and yield its responses as :class:`Delta`; a caller that stops listening
cancels that stream, which cancels the request in Triton (the runtime then frees its KV blocks). Triton's errors
come back as the HTTP error a client should see (:func:`triton_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Optional, Sequence

from pipeline.openai_logprobs import TokenLogprobs
from pipeline.openai_requests import APIError, FrontendConfig
from trtpipe_runtime.detokenize import Utf8Joiner

LOG_PROB_OUTPUTS = ("output_token_ids", "output_log_probs", "top_log_probs", "top_token_ids", "prompt_log_probs",
                    "prompt_top_log_probs", "prompt_top_token_ids")
"""What a request with log probabilities asks the portable runtime's BLS model for (model_repo.generate's
LOG_PROB_OUTPUTS, with the sampled tokens' output_log_probs and the BLS's output_token_ids); the C++ backend's:
pipeline.openai_context_logits (which adds context_logits)."""
_READ = LOG_PROB_OUTPUTS + ("context_logits",)
_DTYPES = {"FP32": "float32", "FP16": "float16", "INT32": "int32"}


def triton_error(message: str) -> APIError:
    """A Triton error message -> the HTTP error a client should see (400 the request, 503 overloaded or down)."""
    m = message.lower()
    if any(k in m for k in ("queue", "overload", "too many", "exceeds maximum queue size", "busy")):
        return APIError(503, f"the server is overloaded, retry later: {message}", "server_error",
                        code="overloaded")
    if any(k in m for k in ("unavailable", "failed to connect", "connection refused", "socket closed", "shutting down",
                            "is not healthy")):  # Python backend: the model's stub process died
        return APIError(503, f"the inference server is unavailable: {message}", "server_error",
                        code="unavailable")
    if any(k in m for k in ("exceed", "must be", "invalid", "expected", "out of range", "not supported")):
        code = "context_length_exceeded" if ("max_input_len" in m or "max_seq_len" in m) else None
        return APIError(400, message, code=code)
    return APIError(500, message, "server_error")


@dataclass
class Delta:
    """One streamed response: the text and token count of one choice's new tokens; with log probabilities asked,
    theirs (``logprobs``) and, in a choice's first response when the prompt's were asked, the runtime's
    ``prompt_log_probs`` / ``prompt_top_log_probs`` / ``prompt_top_token_ids`` (``prompt``: name -> array)."""

    index: int
    text: str
    tokens: int
    logprobs: Optional[TokenLogprobs] = None
    prompt: Optional[dict] = None


class Triton:
    """One aio gRPC client; each request on its own stream (so a disconnect cancels only it)."""

    def __init__(self, cfg: FrontendConfig):
        import tritonclient.grpc.aio as aioclient

        self.cfg = cfg
        self.client = aioclient.InferenceServerClient(cfg.grpc_url)

    async def ready(self) -> bool:
        try:
            return bool(await self.client.is_server_ready() and await self.client.is_model_ready(self.cfg.triton_model))
        except Exception:  # unreachable, starting, stopping
            return False

    async def stub_alive(self, timeout_s: float = 5.0) -> bool:
        """Whether the Triton model still answers: a request with only optional inputs (as many as it has required
        ones, so Triton hands it to the model) must come back with the model's own refusal. Triton's Python backend
        keeps a model READY after its stub process died and answers every request "Stub process '...' is not
        healthy" (python_backend src/python_be.cc): that answer, or none in ``timeout_s``, is False. True when the
        model's config gives no such probe (no optional inputs to send)."""
        import numpy as np
        import tritonclient.grpc as grpcclient

        from pipeline.client import stream_request

        cfg = await self._config()
        if cfg is None:
            return False
        required = [i for i in cfg.get("input", []) if not i.get("optional")]
        probe = [i for i in cfg.get("input", []) if i.get("optional") and i.get("data_type") == "TYPE_INT32"
                 and [int(d) for d in i.get("dims", [])] == [1]][:max(1, len(required))]
        if len(probe) < max(1, len(required)):
            return True
        batched = int(cfg.get("max_batch_size", 0)) > 0
        inputs = []
        for i in probe:
            t = grpcclient.InferInput(i["name"], [1, 1] if batched else [1], "INT32")
            t.set_data_from_numpy(np.zeros([1, 1] if batched else [1], dtype=np.int32))
            inputs.append(t)
        req = stream_request(self.cfg.triton_model, "trtpipe-health-" + uuid.uuid4().hex, inputs, [])

        async def requests():
            yield req

        call = self.client._client_stub.ModelStreamInfer(requests(), metadata=self.client._get_metadata(None),
                                                         timeout=timeout_s)
        answered = False
        try:
            async for resp in call:
                answered = True  # the model's refusal (alive), or Triton's word that its stub died
                return "is not healthy" not in (resp.error_message or "")
            return True
        except Exception:  # no answer in time, or Triton went away
            return False
        finally:
            await _close(call, answered, timeout_s)

    async def _config(self) -> Optional[dict]:
        try:
            cfg = await self.client.get_model_config(self.cfg.triton_model, as_json=True)
        except Exception:  # unreachable
            return None
        return cfg.get("config", cfg)

    async def inputs(self) -> Optional[set]:
        """The names of the Triton model's inputs (its config, asked once; None while Triton cannot say)."""
        if getattr(self, "_inputs", None) is None:
            cfg = await self._config()
            if cfg is None:  # unreachable: ask again next time
                return None
            self._inputs = {i["name"] for i in cfg.get("input", [])}
        return self._inputs

    async def generate(self, prompt: str, max_tokens: int, stop: list[str], extra: dict,
                       logprobs: Sequence[str] = ()) -> AsyncIterator[Delta]:
        """Yield the model's streamed responses for one prompt (``logprobs``: the log-probability tensors to ask for,
        :data:`LOG_PROB_OUTPUTS` or the C++ backend's; each Delta then carries its tokens' and the first the prompt's
        arrays); raise APIError on a request error."""
        import tritonclient.grpc as grpcclient

        from pipeline.client import build_inputs, stream_request

        inputs = build_inputs(prompt, max_tokens, stream=True, stop_words=stop or None, extra=extra)
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("text_output", "num_output_tokens")]
        if extra.get("num_return_sequences", 1) > 1:
            outputs.append(grpcclient.InferRequestedOutput("sequence_index"))
        outputs += [grpcclient.InferRequestedOutput(n) for n in logprobs]
        req = stream_request(self.cfg.triton_model, uuid.uuid4().hex, inputs, outputs)
        done = asyncio.Event()

        async def requests():
            yield req
            await done.wait()  # keep the stream open until the last response (closing it cancels the request)

        call = self.client._client_stub.ModelStreamInfer(requests(), metadata=self.client._get_metadata(None),
                                                         timeout=self.cfg.request_timeout_s)
        finished = False
        joiners: dict[int, Utf8Joiner] = {}  # a character split across responses is sent whole
        try:
            async for resp in call:
                if resp.error_message:
                    finished = True  # Triton ended the request itself
                    raise triton_error(resp.error_message)
                ir = resp.infer_response
                final = ("triton_final_response" in ir.parameters
                         and ir.parameters["triton_final_response"].bool_param)
                if ir.outputs:
                    index, data, tokens = _raw_delta(ir)
                    delta = Delta(index, joiners.setdefault(index, Utf8Joiner()).push(data), tokens)
                    if logprobs:
                        delta.logprobs, delta.prompt = _raw_logprobs(ir)
                    yield delta
                if final:
                    finished = True
                    break
        except APIError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # grpc.aio.AioRpcError and friends: the server went away or timed out
            finished = True
            details = getattr(exc, "details", lambda: str(exc))() or str(exc)
            raise triton_error(f"unavailable: {details}") from exc
        finally:
            done.set()  # ends the request iterator: the client half-closes the stream
            await _close(call, finished)  # unfinished: the client went away, the runtime frees its blocks


async def _close(call, finished: bool, timeout_s: float = 10.0) -> None:
    """End a gRPC stream call: a finished request's stream is read to its end and closed by the server (cancelling
    a finished BLS request crashed tritonserver 2.51: TRITONBACKEND_ResponseFactoryIsCancelled, signal 11); an
    unfinished one is cancelled, which cancels the request in Triton."""
    if not finished:
        call.cancel()
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(_drain(call), timeout_s)


async def _drain(call) -> None:
    async for _ in call:
        pass


def _raw_delta(ir) -> tuple[int, bytes, int]:
    """One ModelInferResponse -> (sequence index, text_output bytes, token count), read from its raw contents
    (BYTES: 4-byte little-endian length, then the bytes, per element; INT32: little-endian), without building
    numpy arrays per token."""
    text, tokens, index = b"", 0, 0
    for out, raw in zip(ir.outputs, ir.raw_output_contents):
        if out.name == "text_output":
            parts, i = [], 0
            while i + 4 <= len(raw):
                n = int.from_bytes(raw[i:i + 4], "little")
                parts.append(raw[i + 4:i + 4 + n])
                i += 4 + n
            text = b"".join(parts)
        elif out.name == "num_output_tokens":
            tokens = sum(int.from_bytes(raw[i:i + 4], "little", signed=True) for i in range(0, len(raw), 4))
        elif out.name == "sequence_index" and len(raw) >= 4:
            index = int.from_bytes(raw[:4], "little", signed=True)
    return index, text, tokens


def _raw_logprobs(ir) -> tuple[TokenLogprobs, Optional[dict]]:
    """One ModelInferResponse's log probabilities: its tokens' (output_token_ids, output_log_probs, top_*) and the
    prompt's arrays when it carries them (the first response). APIError 500 when they do not fit together."""
    import numpy as np

    arrays = {}
    for out, raw in zip(ir.outputs, ir.raw_output_contents):
        if out.name in _READ and out.datatype in _DTYPES:
            arrays[out.name] = np.frombuffer(raw, dtype=_DTYPES[out.datatype]).reshape([int(d) for d in out.shape])
    ids = arrays.get("output_token_ids", np.zeros(0, np.int32)).reshape(-1)
    k = arrays["top_token_ids"].shape[-1] if "top_token_ids" in arrays else 0
    try:
        lp = TokenLogprobs.of(ids, arrays.get("output_log_probs", np.zeros(0, np.float32)).reshape(-1),
                              arrays["top_token_ids"].reshape(-1, k) if k else None,
                              arrays["top_log_probs"].reshape(-1, k) if k else None)
    except (KeyError, ValueError) as exc:
        raise APIError(500, f"the runtime's log probabilities are incomplete: {exc}", "server_error") from None
    prompt = {n: a for n, a in arrays.items() if n.startswith("prompt_") or n == "context_logits"} or None
    return lp, prompt
