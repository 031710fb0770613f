"""The OpenAI frontend counts each request in flight for exactly its life, however it ends: answered whole or
streamed, refused, failed in Triton before or after its first token, or left by its client mid-answer.

No tritonserver: ``create_app(cfg, triton=...)`` gets a scripted Triton, and the application is called as an
ASGI app the way uvicorn calls it (``spec_version`` 2.3: Starlette watches for the disconnect), or as a server of
ASGI 2.4 whose send raises once the client is gone."""

from __future__ import annotations

import asyncio
import json

import pytest

from pipeline.openai_frontend import APIError, FrontendConfig, create_app
from pipeline.openai_triton import Delta

MODEL = "m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
WORDS = [Delta(0, "Hello", 1), Delta(0, " wor", 1), Delta(0, "ld", 1)]


class ScriptedTriton:
    """Answers every request with ``deltas``, then raises ``error`` if one is given, or waits for ever (until
    cancelled) with ``hang``. ``leave`` is set before the response numbered ``leave_at`` (at the hang when that is
    ``len(deltas)``): the test's client goes away then. Records the in-flight gauge at each response and how often
    a stream was closed."""

    def __init__(self, deltas=(), error: BaseException | None = None, hang: bool = False,
                 leave_at: int | None = None):
        self.deltas, self.error, self.hang, self.leave_at = list(deltas), error, hang, leave_at
        self.calls, self.closed, self.seen = 0, 0, []
        self.metrics = None
        self.leave = asyncio.Event()

    async def ready(self) -> bool:
        return True

    async def generate(self, prompt, max_tokens, stop, extra):
        self.calls += 1
        try:
            for i, d in enumerate(self.deltas):
                if i == self.leave_at:
                    self.leave.set()
                self.seen.append(self.metrics.inflight)
                yield d
            if self.error is not None:
                raise self.error
            if self.hang:
                if self.leave_at == len(self.deltas):
                    self.leave.set()
                await asyncio.Event().wait()
        finally:
            self.closed += 1


@pytest.fixture(scope="module")
def tokenizer_dir():
    from tests.conftest import smollm2_tokenizer_dir

    return smollm2_tokenizer_dir()


def _app(tokenizer_dir, triton: ScriptedTriton):
    app = create_app(FrontendConfig("127.0.0.1:1", MODEL, tokenizer_dir, 256, 512), triton=triton)
    triton.metrics = app.state.serving.metrics
    return app


async def _call(app, path: str, body: dict | None = None, *, leave: asyncio.Event | None = None,
                spec: str = "2.3") -> tuple[int | None, bytes]:
    """One HTTP request to the ASGI ``app``: its status and body. ``leave``: the client goes away once it is set
    (spec 2.3: told by ``http.disconnect``; 2.4: a send after it raises OSError, as uvicorn's does)."""
    raw = json.dumps(body).encode() if body is not None else b""
    asked, got = False, {"status": None, "body": b""}

    async def receive():
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await (leave or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if spec >= "2.4" and leave is not None and leave.is_set():
            raise OSError("the client went away")
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
        elif message["type"] == "http.response.body":
            got["body"] += message.get("body", b"")

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec}, "http_version": "1.1",
             "method": "POST" if body is not None else "GET", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 9000), "headers": [(b"content-type", b"application/json")]}
    await app(scope, receive, send)
    return got["status"], got["body"]


async def _inflight(app) -> int:
    _, text = await _call(app, "/metrics")
    return int(next(line for line in text.decode().splitlines()
                    if line.startswith("trtpipe_openai_inflight_requests ")).split()[1])


def _run(tokenizer_dir, triton: ScriptedTriton, path: str, body: dict, **kw) -> tuple[int | None, bytes, int]:
    """Status, body, and the in-flight gauge once the request is over."""
    async def go():
        app = _app(tokenizer_dir, triton)
        status, raw = await _call(app, path, body, **kw)
        return status, raw, await _inflight(app)

    return asyncio.run(go())


@pytest.mark.parametrize("path,body", [("/v1/chat/completions", CHAT),
                                       ("/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 8})])
def test_a_whole_answer_is_counted_while_it_runs_and_not_after(tokenizer_dir, path, body):
    triton = ScriptedTriton(WORDS)
    status, raw, after = _run(tokenizer_dir, triton, path, body)
    out = json.loads(raw)
    assert status == 200 and out["usage"]["completion_tokens"] == 3
    assert "Hello world" in json.dumps(out["choices"][0])
    assert triton.seen == [1, 1, 1] and after == 0 and triton.closed == 1


def test_a_streamed_answer_is_counted_until_its_last_event(tokenizer_dir):
    triton = ScriptedTriton(WORDS)
    status, raw, after = _run(tokenizer_dir, triton, "/v1/chat/completions",
                              {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    events = raw.decode().split("\n\n")
    assert status == 200 and events[-2] == "data: [DONE]"
    assert json.loads(events[-3][len("data: "):])["usage"]["completion_tokens"] == 3
    assert triton.seen == [1, 1, 1] and after == 0 and triton.closed == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_mid_answer_is_counted_out_and_cancelled(tokenizer_dir, stream):
    """As uvicorn serves (ASGI 2.3): Starlette sees the ``http.disconnect`` while Triton is still generating."""
    triton = ScriptedTriton(WORDS[:2], hang=True, leave_at=2)

    async def go():
        app = _app(tokenizer_dir, triton)
        status, raw = await _call(app, "/v1/chat/completions", {**CHAT, "stream": stream}, leave=triton.leave)
        _, text = await _call(app, "/metrics")
        return status, raw, await _inflight(app), text.decode()

    status, raw, after, text = asyncio.run(go())
    assert status == (200 if stream else 499)
    assert after == 0 and triton.closed == 1 and "trtpipe_openai_cancelled_total 1" in text
    if stream:
        assert b'"content":" wor"' in raw and b"[DONE]" not in raw


def test_a_stream_whose_send_fails_is_counted_out_at_once(tokenizer_dir):
    """A server of ASGI 2.4 raises from ``send`` once the client is gone: the events are closed then, not when
    the response is collected (here the traceback keeps it)."""
    from starlette.requests import ClientDisconnect

    triton = ScriptedTriton(WORDS, leave_at=1)

    async def go():
        app = _app(tokenizer_dir, triton)
        with pytest.raises(ClientDisconnect):
            await _call(app, "/v1/chat/completions", {**CHAT, "stream": True}, leave=triton.leave, spec="2.4")
        return await _inflight(app)

    assert asyncio.run(go()) == 0
    assert triton.closed == 1 and triton.seen == [1, 1]


@pytest.mark.parametrize("body,status", [({**CHAT, "max_tokens": 0}, 400), ({**CHAT, "model": "other"}, 404),
                                         ({**CHAT, "n": 99}, 400), ({"model": MODEL}, 400)])
def test_a_refused_request_never_reaches_triton_nor_the_count(tokenizer_dir, body, status):
    triton = ScriptedTriton(WORDS)
    got, raw, after = _run(tokenizer_dir, triton, "/v1/chat/completions", body)
    assert got == status and json.loads(raw)["error"]["message"]
    assert triton.calls == 0 and after == 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tokens", [0, 2])
def test_a_triton_error_before_or_after_the_first_token_is_counted_out(tokenizer_dir, stream, tokens):
    triton = ScriptedTriton(WORDS[:tokens], error=APIError(503, "overloaded", "server_error", code="overloaded"))
    status, raw, after = _run(tokenizer_dir, triton, "/v1/chat/completions", {**CHAT, "stream": stream})
    if stream and tokens:  # the status is sent already: the error goes in the stream
        assert status == 200 and b'"code":"overloaded"' in raw and raw.endswith(b"data: [DONE]\n\n")
    else:
        assert status == 503 and json.loads(raw)["error"]["code"] == "overloaded"
    assert after == 0 and triton.closed == 1


def test_an_unexpected_exception_from_triton_is_counted_out_too(tokenizer_dir):
    triton = ScriptedTriton(error=RuntimeError("a bug"))

    async def go():
        app = _app(tokenizer_dir, triton)
        with pytest.raises(RuntimeError, match="a bug"):  # FastAPI answers 500, then hands it to the server
            await _call(app, "/v1/chat/completions", CHAT)
        return await _inflight(app)

    assert asyncio.run(go()) == 0
