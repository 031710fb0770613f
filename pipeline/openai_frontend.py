"""An OpenAI-compatible HTTP frontend in front of Triton's ``tensorrt_llm_bls`` model (FastAPI on uvicorn).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``, ``GET /health`` (200 when
Triton and its model are ready), ``GET /metrics`` (Prometheus text). It translates, it does not schedule: each
HTTP request becomes one request on its own gRPC stream to the BLS model (tokenize, generate, detokenize, as the
ensemble; the runtime batches requests in flight), and a client that disconnects cancels that stream, which
cancels the request in Triton (the runtime then frees its KV blocks). Started by ``trtpipe serve`` beside tritonserver (``python -m pipeline.openai_frontend ...``).

Formats follow OpenAI's API reference (https://platform.openai.com/docs/api-reference/chat and /completions):
``chat.completion`` / ``chat.completion.chunk`` / ``text_completion`` objects, server-sent events ending with
``data: [DONE]``, ``stream_options.include_usage`` adding a last chunk with ``usage`` and no choices, and errors as
``{"error": {"message", "type", "param", "code"}}``. Token counts: ``completion_tokens`` are the server's
(``num_output_tokens`` of each response); ``prompt_tokens`` are counted here with the model's tokenizer the way the
preprocessing model counts them (same tokenizer folder, same ``add_special_tokens``). The chat template is the
model's own (``tokenizer_config.json`` / ``chat_template.jinja``), applied here.

Sampling follows OpenAI: temperature and top_p default to 1 (sampling); ``temperature: 0`` is greedy. Not
supported, answered with 400: ``logprobs``, tools / function calling, ``response_format`` other than text, several
prompts in one completion request, ``echo``, ``suffix``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from pipeline.openai_requests import (COMPLETIONS_DEFAULT_MAX_TOKENS, APIError, ChatBody, CompletionBody,  # noqa: F401
                                      FrontendConfig, _Body, chat_request, completion_request, prepare, read_json)
from pipeline.openai_triton import Delta, Triton, triton_error  # noqa: F401

log = logging.getLogger("trtpipe.openai")


# ---- the frontend --------------------------------------------------------------------------------------------


@dataclass
class Metrics:
    """Counters for ``/metrics`` (Prometheus text exposition format 0.0.4)."""

    requests: dict = field(default_factory=dict)  # (endpoint, status) -> count
    prompt_tokens: int = 0
    completion_tokens: int = 0
    inflight: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    cancelled: int = 0

    def count(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1

    def text(self) -> str:
        lines = ["# HELP trtpipe_openai_requests_total Requests answered, by endpoint and HTTP status.",
                 "# TYPE trtpipe_openai_requests_total counter"]
        lines += [f'trtpipe_openai_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                  for (e, s), n in sorted(self.requests.items())]
        lines += ["# HELP trtpipe_openai_tokens_total Tokens: prompt (counted here), completion (the server's).",
                  "# TYPE trtpipe_openai_tokens_total counter",
                  f'trtpipe_openai_tokens_total{{kind="prompt"}} {self.prompt_tokens}',
                  f'trtpipe_openai_tokens_total{{kind="completion"}} {self.completion_tokens}',
                  "# HELP trtpipe_openai_inflight_requests Requests being answered now.",
                  "# TYPE trtpipe_openai_inflight_requests gauge",
                  f"trtpipe_openai_inflight_requests {self.inflight}",
                  "# HELP trtpipe_openai_cancelled_total Requests whose client went away before the end.",
                  "# TYPE trtpipe_openai_cancelled_total counter",
                  f"trtpipe_openai_cancelled_total {self.cancelled}",
                  "# HELP trtpipe_openai_time_to_first_token_seconds Time from request to first token.",
                  "# TYPE trtpipe_openai_time_to_first_token_seconds summary",
                  f"trtpipe_openai_time_to_first_token_seconds_sum {self.ttft_sum}",
                  f"trtpipe_openai_time_to_first_token_seconds_count {self.ttft_count}"]
        return "\n".join(lines) + "\n"


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def create_app(cfg: FrontendConfig, triton: Optional[Triton] = None):
    """The FastAPI application for ``cfg`` (``triton``: the client to use; default one on ``cfg.grpc_url``)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(cfg.tokenizer_dir), local_files_only=True,
                                        trust_remote_code=cfg.trust_remote_code)
    metrics = Metrics()
    app = FastAPI(title="trtpipe OpenAI-compatible frontend", docs_url=None, redoc_url=None)
    created = int(time.time())
    state: dict = {"triton": triton}

    def backend() -> Triton:
        if state["triton"] is None:
            state["triton"] = Triton(cfg)
        return state["triton"]

    def error_response(endpoint: str, err: APIError):
        metrics.count(endpoint, err.status)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(request.url.path, APIError(400, f"{param or 'body'}: {first.get('msg', 'invalid')}",
                                                         param=param))

    @app.get("/health")
    async def health():
        ok = await backend().ready()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": cfg.model, "object": "model", "created": created,
                                            "owned_by": "trtpipe"}]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != cfg.model:
            return error_response("/v1/models", APIError(404, f"model {model_id!r} not found: this server serves "
                                                              f"{cfg.model!r}", param="model", code="model_not_found"))
        return {"id": cfg.model, "object": "model", "created": created, "owned_by": "trtpipe"}

    async def run(request: Request, endpoint: str, body: _Body, prompt: str, chat: bool):
        try:
            n_prompt, max_tokens, stop, extra = prepare(cfg, tok, body, prompt, chat)
        except APIError as err:
            return error_response(endpoint, err)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        t0 = time.perf_counter()
        stream = backend().generate(prompt, max_tokens, stop, extra)
        metrics.inflight += 1
        try:  # the first response decides the status code: an error before any token is a plain HTTP error
            first = await stream.__anext__()
        except StopAsyncIteration:
            first = None
        except APIError as err:
            metrics.inflight -= 1
            return error_response(endpoint, err)
        except asyncio.CancelledError:
            metrics.inflight -= 1
            raise
        metrics.ttft_sum += time.perf_counter() - t0
        metrics.ttft_count += 1
        metrics.prompt_tokens += n_prompt

        async def deltas():
            if first is not None:
                yield first
            async for d in stream:
                yield d

        def finish(tokens: int) -> str:
            return "length" if tokens >= max_tokens else "stop"

        def usage(completion: int) -> dict:
            return {"prompt_tokens": n_prompt, "completion_tokens": completion, "total_tokens": n_prompt + completion}

        if not body.stream:
            texts, counts = [""] * body.n, [0] * body.n
            try:
                async for d in _until_disconnect(request, deltas()):
                    texts[d.index] += d.text
                    counts[d.index] += d.tokens
            except APIError as err:
                metrics.inflight -= 1
                return error_response(endpoint, err)
            except _Disconnected:
                metrics.inflight -= 1
                metrics.cancelled += 1
                return JSONResponse({}, status_code=499)
            metrics.inflight -= 1
            metrics.completion_tokens += sum(counts)
            metrics.count(endpoint, 200)
            if chat:
                choices = [{"index": i, "message": {"role": "assistant", "content": texts[i]}, "logprobs": None,
                            "finish_reason": finish(counts[i])} for i in range(body.n)]
            else:
                choices = [{"index": i, "text": texts[i], "logprobs": None, "finish_reason": finish(counts[i])}
                           for i in range(body.n)]
            return {"id": rid, "object": obj, "created": int(time.time()), "model": cfg.model, "choices": choices,
                    "usage": usage(sum(counts))}

        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((body.stream_options or {}).get("include_usage"))

        created_at = int(time.time())  # one `created` for every chunk of the completion, as OpenAI's
        head = (f'data: {{"id":"{rid}","object":"{chunk_obj}","created":{created_at},"model":'
                f'{json.dumps(cfg.model)},"choices":[{{"index":')
        tail = ',"logprobs":null,"finish_reason":null}]' + (',"usage":null' if include_usage else "") + "}\n\n"
        key = ',"delta":{"content":' if chat else ',"text":'
        close = "}" if chat else ""

        def content_event(index: int, text: str) -> bytes:
            """A content chunk, as :func:`chunk` would write it, without building and dumping the dict."""
            return (head + str(index) + key + json.dumps(text) + close + tail).encode()

        def chunk(index: int, text: Optional[str], reason: Optional[str], role: bool = False) -> dict:
            if chat:
                delta = ({"role": "assistant", "content": ""} if role else
                         ({} if text is None else {"content": text}))
                choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": reason}
            out = {"id": rid, "object": chunk_obj, "created": created_at, "model": cfg.model, "choices": [choice]}
            if include_usage:
                out["usage"] = None
            return out

        async def events():
            counts = [0] * body.n
            finished = False
            try:
                if chat:
                    for i in range(body.n):
                        yield _sse(chunk(i, None, None, role=True))
                async for d in deltas():
                    counts[d.index] += d.tokens
                    if d.text:
                        yield content_event(d.index, d.text)
                for i in range(body.n):
                    yield _sse(chunk(i, None if chat else "", finish(counts[i])))
                if include_usage:
                    yield _sse({"id": rid, "object": chunk_obj, "created": created_at, "model": cfg.model,
                                "choices": [], "usage": usage(sum(counts))})
                yield b"data: [DONE]\n\n"
                finished = True
                metrics.count(endpoint, 200)
            except APIError as err:  # after the first token: the status is sent already, the error goes in the stream
                metrics.count(endpoint, err.status)
                yield _sse(err.body())
                yield b"data: [DONE]\n\n"
                finished = True
            finally:
                metrics.inflight -= 1
                metrics.completion_tokens += sum(counts)
                if not finished:  # the client went away: the generator was closed, the gRPC stream cancelled
                    metrics.cancelled += 1
                    await stream.aclose()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        try:
            body, prompt = chat_request(tok, await read_json(request))
        except APIError as err:
            return error_response("/v1/chat/completions", err)
        return await run(request, "/v1/chat/completions", body, prompt, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body, prompt = completion_request(await read_json(request))
        except APIError as err:
            return error_response("/v1/completions", err)
        return await run(request, "/v1/completions", body, prompt, chat=False)

    return app


class _Disconnected(Exception):
    """The HTTP client went away before the answer was complete."""


async def _until_disconnect(request, items: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    """``items`` until they end, or raise _Disconnected as soon as the client disconnects (closing ``items``,
    which cancels the request in Triton)."""
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    it = items.__aiter__()
    try:
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if nxt in done:
                try:
                    yield nxt.result()
                except StopAsyncIteration:
                    return
            else:
                nxt.cancel()
                raise _Disconnected()
    finally:
        watcher.cancel()
        await it.aclose()


async def _wait_disconnect(request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def build_parser() -> argparse.ArgumentParser:
    """The command line ``model_repo.deploy.frontend_argv`` writes."""
    p = argparse.ArgumentParser(prog="python -m pipeline.openai_frontend",
                                description="OpenAI-compatible HTTP frontend in front of Triton's BLS model "
                                            "(started by `trtpipe serve`).")
    p.add_argument("--grpc-url", required=True, help="Triton gRPC host:port")
    p.add_argument("--model", required=True, help="the served model id (clients name it in `model`)")
    p.add_argument("--tokenizer", type=Path, required=True, help="tokenizer folder (the build's engine/)")
    p.add_argument("--max-input-len", type=int, required=True)
    p.add_argument("--max-seq-len", type=int, required=True)
    p.add_argument("--add-special-tokens", action="store_true", help="count prompt tokens with special tokens")
    p.add_argument("--trust-remote-code", action="store_true", help="let the tokenizer's own code run (the build "
                   "file's model.trust_remote_code; default off)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--max-n", type=int, default=8, help="most choices per request (default 8)")
    p.add_argument("--triton-model", default="tensorrt_llm_bls", help="the Triton model requests go to (default "
                   "tensorrt_llm_bls: it forwards cancellation; `ensemble` does not)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = FrontendConfig(args.grpc_url, args.model, args.tokenizer, args.max_input_len, args.max_seq_len,
                         args.add_special_tokens, triton_model=args.triton_model, max_n=args.max_n,
                         trust_remote_code=args.trust_remote_code)
    uvicorn.run(create_app(cfg), host=args.host, port=args.port, log_level="info", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
