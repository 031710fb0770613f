"""The load tester's OpenAI side: one streamed HTTP request per request record, to any OpenAI-compatible server
(this project's frontend, trtllm-serve, vLLM, Dynamo's frontend).

Requests stream (``stream: true`` with ``stream_options.include_usage``). Times: a response is each server-sent
event that carries text (or tool calls); TTFT is the first, ITL the gaps between them (as vLLM's
``benchmark_serving.py`` and aiperf time chunks). With a structured-output constraint the body carries it
(``response_format``, ``tools`` / ``tool_choice``) and each answer's text, tool calls and finish reason are kept
to be checked (pipeline.loadtest.api.check_answers). Tokens: the final ``usage`` chunk's ``completion_tokens`` / ``prompt_tokens`` (the server's
counts), spread over the chunks (one each, the rest on the last); a server that sends no usage is counted one token
per chunk and the record says so (``server["tokens_from"] = "chunks"``). A refused, reset or closed connection, and a
stream that ends before ``data: [DONE]``, is a ``connection`` error (the server went away: the point is incomplete).
"""

from __future__ import annotations

import asyncio
import json
import time

from pipeline.loadtest.metrics import RequestRecord
from pipeline.loadtest.workload import RequestSpec


def openai_body(endpoint: str, model: str, rid: str, spec: RequestSpec, inputs: dict) -> tuple[str, dict]:
    """(path, JSON body) of one request: greedy (temperature 0), ``max_tokens`` from the workload, ``ignore_eos``
    when the run fixes output lengths (the load test's ``end_id`` input), streamed with usage."""
    body: dict = {"model": spec.model or model, "max_tokens": int(spec.max_tokens), "temperature": 0, "stream": True,
                  "stream_options": {"include_usage": True}}
    if "end_id" in inputs:
        body["ignore_eos"] = True
    body.update(inputs.get("openai_fields") or {})  # the structured-output constraint (response_format, tools)
    if endpoint == "openai-chat":
        messages = ([{"role": "system", "content": spec.shared_prefix}] if spec.shared_prefix else [])
        body["messages"] = messages + [{"role": "user", "content": spec.prompt}]
        return "/chat/completions", body
    body["prompt"] = spec.text
    return "/completions", body


def _kind(status: int, message: str) -> str:
    if status in (429, 503) and "overloaded" in message.lower():
        return "overloaded"
    if status in (408, 504):
        return "timeout"
    if status in (502, 503):
        return "unavailable"
    if 400 <= status < 500:
        return "invalid_request"
    return "server_error"


class OpenAIConnection:
    """One aiohttp session (keep-alive connections, no limit: the run's concurrency bounds the requests)."""

    def __init__(self, base_url: str, chat: bool, collect_text: bool = False):
        self.base_url, self.chat = base_url.rstrip("/"), chat
        self.collect_text = collect_text  # keep each answer's text and tool calls (to check them)
        self.session = None
        self.pending: dict[int, RequestRecord] = {}

    def open(self) -> None:
        """Open the session; with $TRTPIPE_API_KEY (else $OPENAI_API_KEY, what OpenAI clients read) set, every request
        carries ``Authorization: Bearer <key>`` (a frontend started with that key: pipeline.openai_security)."""
        import os

        import aiohttp

        from model_repo.launch import FRONTEND_API_KEY_ENV

        key = os.environ.get(FRONTEND_API_KEY_ENV) or os.environ.get("OPENAI_API_KEY")
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=None),
                                             headers={"Authorization": f"Bearer {key}"} if key else None)

    async def send(self, rec: RequestRecord, payload: tuple[str, dict], timeout_s: float) -> RequestRecord:
        import aiohttp

        path, body = payload
        self.pending[id(rec)] = rec
        rec.sent = time.monotonic()
        usage, finished = None, False
        texts: list[str] = []
        calls: list[dict] = []
        try:
            async with asyncio.timeout(timeout_s):
                async with self.session.post(self.base_url + path, json=body) as resp:
                    if resp.status != 200:
                        text = (await resp.text())[:500]
                        rec.error, rec.error_kind = f"HTTP {resp.status}: {text}", _kind(resp.status, text)
                        return rec
                    async for line in resp.content:
                        if not line.endswith(b"\n"):  # the connection closed in the middle of an event
                            break
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            finished = True
                            break
                        try:
                            obj = json.loads(data)
                        except ValueError:
                            rec.error, rec.error_kind = f"in stream: not a JSON event: {data[:200]!r}", "server_error"
                            return rec
                        if "error" in obj:
                            err = obj["error"]
                            rec.error = f"in stream: {err.get('message', err)}"
                            rec.error_kind = "server_error"
                            return rec
                        now = time.monotonic()
                        usage = obj.get("usage") or usage
                        for ch in obj.get("choices") or []:
                            delta = ch.get("delta") or {}
                            text = delta.get("content") if self.chat else ch.get("text")
                            if ch.get("finish_reason"):
                                rec.finish_reason = ch["finish_reason"]
                            if delta.get("tool_calls"):  # an event that carries tokens, as text does
                                calls.append(delta)
                                rec.response_times.append(now)
                                rec.response_tokens.append(1)
                            if text:
                                rec.response_times.append(now)
                                rec.response_tokens.append(1)
                                if self.collect_text:
                                    texts.append(text)
            if not finished:
                rec.error = (f"the server closed the stream before data: [DONE] (after {len(rec.response_times)} "
                             "text events)")
                rec.error_kind = "connection"
                return rec
            rec.done = time.monotonic()
            if self.collect_text:
                rec.text = "".join(texts)
                rec.tool_calls = merge_tool_calls(calls) if calls else None
            if not rec.response_times:
                rec.response_times.append(rec.done)
                rec.response_tokens.append(0)
            _apply_usage(rec, usage)
        except TimeoutError:
            rec.error, rec.error_kind = f"no complete answer within {timeout_s:.0f} s", "timeout"
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:  # refused, reset, closed
            rec.error, rec.error_kind = f"{type(exc).__name__}: {exc}", "connection"
        except aiohttp.ClientError as exc:
            rec.error, rec.error_kind = f"{type(exc).__name__}: {exc}", "unavailable"
        finally:
            self.pending.pop(id(rec), None)
        return rec

    def abandon(self, kind: str, message: str) -> None:
        for rec in list(self.pending.values()):
            rec.error, rec.error_kind = message, kind
        self.pending.clear()

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def merge_tool_calls(deltas: list[dict]) -> list[dict]:
    """The OpenAI ``tool_calls`` a stream's deltas add up to, in index order: each call's id, type and name from
    the part that opens it, its arguments joined over the parts (a part with a new index opens a call; one with no
    index continues the last)."""
    calls: dict[int, dict] = {}
    last = 0
    for delta in deltas:
        for part in delta.get("tool_calls") or []:
            i = part.get("index", last)
            last = i
            fn = part.get("function") or {}
            call = calls.setdefault(i, {"id": None, "type": "function", "function": {"name": None, "arguments": ""}})
            call["id"] = part.get("id") or call["id"]
            call["function"]["name"] = fn.get("name") or call["function"]["name"]
            call["function"]["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


def _apply_usage(rec: RequestRecord, usage: dict | None) -> None:
    """Spread the server's completion_tokens over the text chunks (one each, the rest on the last; a chunk with
    no token of its own when there were more chunks than tokens)."""
    if not usage:
        rec.server = {**(rec.server or {}), "tokens_from": "chunks"}
        return
    n = int(usage.get("completion_tokens") or 0)
    k = len(rec.response_tokens)
    per = [1 if i < n else 0 for i in range(k)]
    if k and n > k:
        per[-1] += n - k
    rec.response_tokens = per
    if usage.get("prompt_tokens"):
        rec.input_tokens = int(usage["prompt_tokens"])
    rec.server = {**(rec.server or {}), "tokens_from": "usage"}
