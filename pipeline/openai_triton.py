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
from typing import AsyncIterator

from pipeline.openai_requests import APIError, FrontendConfig
from trtpipe_runtime.detokenize import Utf8Joiner


def triton_error(message: str) -> APIError:
    """A Triton error message -> the HTTP error a client should see (400 the request, 503 overloaded or down)."""
    m = message.lower()
    if any(k in m for k in ("queue", "overload", "too many", "exceeds maximum queue size", "busy")):
        return APIError(503, f"the server is overloaded, retry later: {message}", "server_error",
                        code="overloaded")
    if any(k in m for k in ("unavailable", "failed to connect", "connection refused", "socket closed")):
        return APIError(503, f"the inference server is unavailable: {message}", "server_error",
                        code="unavailable")
    if any(k in m for k in ("exceed", "must be", "invalid", "expected", "out of range", "not supported")):
        code = "context_length_exceeded" if ("max_input_len" in m or "max_seq_len" in m) else None
        return APIError(400, message, code=code)
    return APIError(500, message, "server_error")


@dataclass
class Delta:
    """One streamed response: the text and token count of one choice's new tokens."""

    index: int
    text: str
    tokens: int


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

    async def generate(self, prompt: str, max_tokens: int, stop: list[str], extra: dict) -> AsyncIterator[Delta]:
        """Yield the model's streamed responses for one prompt; raise APIError on a request error."""
        import tritonclient.grpc as grpcclient

        from pipeline.client import build_inputs, stream_request

        inputs = build_inputs(prompt, max_tokens, stream=True, stop_words=stop or None, extra=extra)
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("text_output", "num_output_tokens")]
        if extra.get("num_return_sequences", 1) > 1:
            outputs.append(grpcclient.InferRequestedOutput("sequence_index"))
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
                    yield Delta(index, joiners.setdefault(index, Utf8Joiner()).push(data), tokens)
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
            if finished:  # let the server close it; cancelling a finished BLS request crashed tritonserver 2.51
                with contextlib.suppress(Exception):  # (TRITONBACKEND_ResponseFactoryIsCancelled, signal 11)
                    await asyncio.wait_for(_drain(call), 10)
            else:  # the client went away: Triton cancels the request and the runtime frees its blocks
                call.cancel()


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
