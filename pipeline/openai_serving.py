"""The OpenAI frontend's answers: one :class:`Serving` per application, between the routes and Triton.

One job: answer each OpenAI request from Triton's streamed responses, as OpenAI's ``chat.completion`` /
``chat.completion.chunk`` / ``text_completion`` objects (the whole answer, or server-sent events ending with
``data: [DONE]``), and keep ``/metrics``' counters. A request is counted in flight in one place, for its whole
life: from the call to Triton to the last event sent, or to the client going away (:meth:`Serving._life`).

Token counts: ``completion_tokens`` are the server's (``num_output_tokens`` of each response); ``prompt_tokens``
are counted here with the model's tokenizer the way the preprocessing model counts them (same tokenizer folder,
same ``add_special_tokens``).

Log probabilities (``logprobs``; completions' ``echo``): each response's tokens come with theirs, so a streamed
chunk carries the log probabilities of its own tokens (a chunk whose text a split character holds back still
carries them); an echoed prompt is the first chunk of its choice. The shapes are pipeline.openai_logprobs'.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator, Optional, Union

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from pipeline.openai_context_logits import CONTEXT_LOGITS, SAMPLED_INPUT, engine_path_request
from pipeline.openai_context_logits import prompt_arrays as context_prompt_arrays
from pipeline.openai_logprobs import TokenLogprobs, TokenTexts, chat_content, completion_logprobs
from pipeline.openai_requests import (LOG_PROB_INPUT, APIError, FrontendConfig, Prepared, _Body, chat_request,
                                      completion_request, model_not_found, prepare, read_json)
from pipeline.openai_triton import LOG_PROB_OUTPUTS, Delta, Triton
from trtpipe_runtime.detokenize import StopMatcher

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
"""The two generating routes (also the ``endpoint`` label of ``/metrics``)."""


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
    by_model: dict = field(default_factory=dict)  # model id (base or LoRA adapter) -> requests sent to Triton

    def count(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """Count one request in flight for as long as the ``with`` block runs, however it ends."""
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1

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
                  f"trtpipe_openai_time_to_first_token_seconds_count {self.ttft_count}",
                  "# HELP trtpipe_openai_model_requests_total Requests sent to Triton, by model (base or LoRA "
                  "adapter).",
                  "# TYPE trtpipe_openai_model_requests_total counter"]
        lines += [f'trtpipe_openai_model_requests_total{{model="{_label(m)}"}} {n}'
                  for m, n in sorted(self.by_model.items())]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A Prometheus label value, escaped as the text format asks (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_EVENTS = object()
"""What :meth:`Serving._life` yields first when the answer streams: its events follow."""


class Serving:
    """The frontend's state (the served config, the tokenizer, the Triton client, the counters) and its answers.

    ``tok``: the model's tokenizer (chat template, prompt counts); ``triton``: the client to use, by default one
    on ``cfg.grpc_url``, made at the first request that needs it. Each answer is a response or a JSON-able dict."""

    def __init__(self, cfg: FrontendConfig, tok: Any, triton: Optional[Triton] = None):
        self.cfg, self.tok = cfg, tok
        self.texts = TokenTexts(tok)  # token id -> its string in `logprobs` (cached for the server's life)
        self.metrics = Metrics()
        self.created = int(time.time())
        self._triton = triton

    @property
    def triton(self) -> Triton:
        if self._triton is None:
            self._triton = Triton(self.cfg)
        return self._triton

    def error(self, endpoint: str, err: APIError) -> JSONResponse:
        """``err`` as OpenAI's error body with its status, counted for ``endpoint``."""
        self.metrics.count(endpoint, err.status)
        return JSONResponse(err.body(), status_code=err.status)

    def invalid(self, path: str, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's own validation error on ``path`` as an OpenAI 400 naming the field."""
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return self.error(path, APIError(400, f"{param or 'body'}: {first.get('msg', 'invalid')}", param=param))

    async def health(self) -> JSONResponse:
        """200 ``{"status": "ok"}`` when Triton and its model are ready and the model answers (its Python-backend stub
        alive: :meth:`Triton.stub_alive`), else 503 ``{"status": "unavailable"}``."""
        ok = await self.triton.ready() and await self.triton.stub_alive()
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    def prometheus(self) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    def models(self) -> dict:
        """Every served id: the base model, then each LoRA adapter (vLLM's list)."""
        return {"object": "list", "data": [self._model_card(m) for m in self.cfg.served]}

    def model(self, model_id: str) -> Union[dict, JSONResponse]:
        """A served model's card (the base or an adapter); 404 ``model_not_found`` for another id."""
        if model_id not in self.cfg.served:
            return self.error("/v1/models", model_not_found(self.cfg, model_id))
        return self._model_card(model_id)

    def _model_card(self, model_id: str) -> dict:
        """vLLM's model card: an adapter's ``root`` is its folder and ``parent`` the base model's id; the base
        model's root is its own id, its parent null."""
        adapter = model_id in self.cfg.adapters
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": "trtpipe",
                "root": self.cfg.adapter_paths.get(model_id, model_id) if adapter else model_id,
                "parent": self.cfg.model if adapter else None}

    async def answer(self, request, chat: bool):
        """Answer one ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` request (a Starlette ``Request``):
        an OpenAI error for a request refused or failed before its first token, else the whole answer (a dict), or,
        for ``stream: true``, its server-sent events. 499 with ``{}`` when the client goes away before a
        non-streamed answer is complete."""
        endpoint = CHAT if chat else COMPLETIONS
        try:
            raw = await read_json(request, self.cfg.body_limit)
            if chat:
                body, prompt = chat_request(self.tok, raw)
                jobs = [(prompt, prepare(self.cfg, self.tok, body, prompt, True))]
            else:
                body, prompts = completion_request(self.tok, raw, self.cfg.add_special_tokens, self.cfg.max_input_len)
                jobs = [(p, _nth(i, len(prompts), prepare, self.cfg, self.tok, body, p, False, sent))
                        for i, (p, sent) in enumerate(zip(prompts, body.prompts()))]
            if jobs[0][1].logprobs is not None:
                jobs = [(p, await self._check_logprobs(chat, asked)) for p, asked in jobs]
        except APIError as err:
            return self.error(endpoint, err)
        if len(jobs) > 1:
            return await self._several(request, endpoint, body, jobs)
        prompt, asked = jobs[0]
        life = self._life(request, endpoint, body, prompt, asked, chat)
        response = await life.__anext__()
        if response is _EVENTS:
            return _EventStream(life, media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await life.aclose()
        return response

    async def _several(self, request, endpoint: str, body: _Body, jobs: list) -> Union[dict, JSONResponse]:
        """A non-streamed completion of several prompts (``jobs``: each prompt and its Prepared): each sent to Triton
        at once as a request of its own, the answers joined as OpenAI's legacy endpoint joins them: prompt p's
        choice j has ``index`` p x n + j, one id, usage summed. The first failed prompt's error (in prompt order)
        is the answer; ``/metrics`` counts each prompt as a request."""
        lives = [self._life(request, endpoint, body, prompt, asked, False) for prompt, asked in jobs]
        try:
            answers = await asyncio.gather(*(life.__anext__() for life in lives))
        finally:
            for life in lives:
                await life.aclose()
        failed = next((a for a in answers if not isinstance(a, dict)), None)
        if failed is not None:
            return failed
        choices = [dict(c, index=p * body.n + c["index"]) for p, a in enumerate(answers) for c in a["choices"]]
        return {**answers[0], "choices": choices,
                "usage": _usage(sum(a["usage"]["prompt_tokens"] for a in answers),
                                sum(a["usage"]["completion_tokens"] for a in answers))}

    async def _check_logprobs(self, chat: bool, asked: Prepared) -> Prepared:
        """``asked`` with the log-probability tensors to ask for, by what the Triton model declares: this project's
        log-prob tensors (its ``num_top_logprobs`` input: the portable runtime), else upstream's ``return_log_probs``
        (the C++ backend: pipeline.openai_context_logits rewrites the request, or refuses what it cannot answer),
        else APIError 400 naming ``logprobs``. When Triton cannot say (unreachable), the request goes on as for the
        portable runtime and fails there as any other."""
        inputs = await self.triton.inputs()
        if inputs is None or LOG_PROB_INPUT in inputs:
            return asked._replace(outputs=LOG_PROB_OUTPUTS)
        if SAMPLED_INPUT in inputs:
            return engine_path_request(asked, chat, self.cfg.context_logits)
        raise APIError(400, f"logprobs: this server's runtime returns no log probabilities (its Triton model "
                            f"{self.cfg.triton_model} declares neither {LOG_PROB_INPUT} nor {SAMPLED_INPUT}): leave "
                            f"logprobs{'/top_logprobs' if chat else ''} out, or serve a build with runtime pytorch",
                       param="logprobs")

    async def _life(self, request, endpoint: str, body: _Body, prompt: str, asked: Prepared,
                    chat: bool) -> AsyncIterator[Any]:
        """One request's whole life in Triton, counted in flight (the only place that counts it) until it ends:
        answered, failed, or given up by its client (the generator closed). Yields the answer first (an error
        response, the whole answer, or ``_EVENTS``), then, when streaming, the events (bytes)."""
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.metrics.by_model[body.model] = self.metrics.by_model.get(body.model, 0) + 1
        t0 = time.perf_counter()
        stream = self.triton.generate(prompt, asked.max_tokens, [], asked.extra,  # stop strings: matched here
                                      **({"logprobs": asked.outputs} if asked.logprobs is not None else {}))
        with self.metrics.in_flight():
            try:  # the first response decides the status code: an error before any token is a plain HTTP error
                first = await stream.__anext__()
            except StopAsyncIteration:
                first = None
            except APIError as err:
                yield self.error(endpoint, err)
                return
            self.metrics.ttft_sum += time.perf_counter() - t0
            self.metrics.ttft_count += 1
            self.metrics.prompt_tokens += asked.n_prompt
            stopped: set[int] = set()  # the choices a stop string ended
            deltas = _stopping(_copied(_prepend(first, stream), asked.copies), stream, asked.stop, body.n, stopped)
            if not body.stream:
                yield await self._whole(request, endpoint, body, asked, chat, rid, deltas, stopped, prompt)
                return
            sse = Events(rid, body.model, chat, bool((body.stream_options or {}).get("include_usage")))
            yield _EVENTS
            async with contextlib.aclosing(self._events(endpoint, body.n, asked, sse, deltas, stream,
                                                        stopped, prompt)) as events:
                async for event in events:
                    yield event

    async def _whole(self, request, endpoint: str, body: _Body, asked: Prepared, chat: bool, rid: str,
                     deltas: AsyncIterator[Delta], stopped: set[int], prompt: str):
        """The non-streamed answer: every choice's text gathered, or an error, or 499 when the client goes away."""
        texts, counts = [""] * body.n, [0] * body.n
        lps = [TokenLogprobs() for _ in range(body.n)]
        prompts: list = [None] * body.n
        try:
            async for d in _until_disconnect(request, deltas):
                if d.prompt is not None and prompts[d.index] is None:
                    prompts[d.index] = d.prompt
                if not asked.generate:  # echo with max_tokens 0: the one token generated is dropped
                    continue
                texts[d.index] += d.text
                counts[d.index] += d.tokens
                if d.logprobs is not None:
                    lps[d.index].extend(d.logprobs)
            logprobs = [self._choice_logprobs(asked, chat, prompts[i], lps[i], len(prompt) if asked.echo else 0)
                        for i in range(body.n)]
        except APIError as err:
            return self.error(endpoint, err)
        except _Disconnected:
            self.metrics.cancelled += 1
            return JSONResponse({}, status_code=499)
        self.metrics.completion_tokens += sum(counts)
        self.metrics.count(endpoint, 200)
        reasons = [_finish(c, asked.max_tokens, i in stopped, asked.generate) for i, c in enumerate(counts)]
        if chat:
            messages = [_message(asked.tools, texts[i]) for i in range(body.n)]
            choices = [{"index": i, "message": messages[i], "logprobs": logprobs[i],
                        "finish_reason": "tool_calls" if messages[i].get("tool_calls") else reasons[i]}
                       for i in range(body.n)]
        else:
            lead = prompt if asked.echo else ""
            choices = [{"index": i, "text": lead + texts[i], "logprobs": logprobs[i], "finish_reason": reasons[i]}
                       for i in range(body.n)]
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": body.model, "choices": choices, "usage": _usage(asked.n_prompt, sum(counts))}

    def _choice_logprobs(self, asked: Prepared, chat: bool, prompt_arrays: Optional[dict], lp: TokenLogprobs,
                         generated_offset: int) -> Optional[dict]:
        """One choice's ``logprobs`` object (None when not asked): chat's ``{"content": [...], "refusal": null}``,
        completions' ``{tokens, token_logprobs, top_logprobs, text_offset}`` over the echoed prompt's tokens (from
        ``prompt_arrays``, the runtime's) then ``lp``'s, the generated tokens' text starting at ``generated_offset``
        characters. APIError 500 when the runtime's prompt log probabilities are missing or do not fit."""
        k = asked.logprobs
        if k is None:
            return None
        if chat:
            return {"content": chat_content(self.texts, lp, k), "refusal": None}
        if not asked.echo:
            return completion_logprobs(self.texts, lp, k, generated_offset)
        whole = self._prompt_logprobs(asked, prompt_arrays)
        whole.extend(lp)
        return completion_logprobs(self.texts, whole, k)

    def _prompt_logprobs(self, asked: Prepared, arrays: Optional[dict]) -> TokenLogprobs:
        """The echoed prompt's tokens and log probabilities from the runtime's prompt_* arrays, or from its
        context_logits (pipeline.openai_context_logits.prompt_arrays: the same arrays)."""
        k = asked.logprobs
        try:
            if arrays and CONTEXT_LOGITS in arrays and "prompt_log_probs" not in arrays:
                arrays = context_prompt_arrays(asked.prompt_ids, arrays[CONTEXT_LOGITS], k)
        except ValueError as exc:
            raise APIError(500, f"the runtime's context logits do not fit the prompt: {exc}", "server_error") from None
        if not arrays or "prompt_log_probs" not in arrays:
            raise APIError(500, "the runtime sent no prompt log probabilities (return_prompt_log_probs or "
                                "return_context_logits)", "server_error")
        top_ids, top = arrays.get("prompt_top_token_ids"), arrays.get("prompt_top_log_probs")
        try:
            if k and (top_ids is None or top is None):
                raise KeyError("prompt_top_token_ids / prompt_top_log_probs")
            lp = TokenLogprobs.prompt(asked.prompt_ids, arrays["prompt_log_probs"].reshape(-1),
                                      top_ids.reshape(-1, top_ids.shape[-1]) if k else None,
                                      top.reshape(-1, top.shape[-1]) if k else None)
        except (KeyError, ValueError) as exc:
            raise APIError(500, f"the runtime's prompt log probabilities do not fit the prompt: {exc}",
                           "server_error") from None
        return lp[asked.echo_from:]

    async def _events(self, endpoint: str, n: int, asked: Prepared, sse: Events, deltas: AsyncIterator[Delta],
                      stream: AsyncIterator[Delta], stopped: set[int], prompt: str) -> AsyncIterator[bytes]:
        """The streamed answer's events for ``n`` choices; an error after the first token goes in the stream (the
        status is sent already). Closed before its end (the client went away): counted cancelled, and ``stream``
        closed, which cancels the request in Triton. With ``echo``, each choice's first chunk is the prompt (and its
        log probabilities, which come with the first response)."""
        counts = [0] * n
        sent = [0] * n  # characters of each choice's text sent (completions' text_offset)
        echoed = [not asked.echo] * n
        finished = False
        calls = [_ToolCalls(asked.tools) if asked.tools is not None else None for _ in range(n)]
        try:
            if sse.chat:
                for i in range(n):
                    yield sse.role(i)
            async for d in deltas:
                i = d.index
                if not echoed[i]:
                    echoed[i] = True
                    yield self._echo_chunk(sse, asked, i, prompt, d.prompt)
                    sent[i] += len(prompt)
                if not asked.generate:
                    continue
                counts[i] += d.tokens
                if calls[i] is not None:
                    for payload in calls[i].feed(d.text):
                        yield sse.delta(i, payload)
                elif asked.logprobs is not None and d.logprobs is not None and len(d.logprobs):
                    yield sse.chunk(i, d.text, {"content": chat_content(self.texts, d.logprobs, asked.logprobs),
                                                "refusal": None} if sse.chat else
                                    completion_logprobs(self.texts, d.logprobs, asked.logprobs, sent[i]))
                elif d.text:
                    yield sse.content(i, d.text)
                sent[i] += len(d.text)
            for i in range(n):
                if not echoed[i]:  # no response came for it
                    yield self._echo_chunk(sse, asked, i, prompt, None)
                called = False
                if calls[i] is not None:
                    for payload in calls[i].finish():
                        yield sse.delta(i, payload)
                    called = calls[i].called
                yield sse.finish(i, "tool_calls" if called else
                                 _finish(counts[i], asked.max_tokens, i in stopped, asked.generate))
            if sse.include_usage:
                yield sse.usage(_usage(asked.n_prompt, sum(counts)))
            yield DONE
            finished = True
            self.metrics.count(endpoint, 200)
        except APIError as err:
            self.metrics.count(endpoint, err.status)
            yield _sse(err.body())
            yield DONE
            finished = True
        finally:
            self.metrics.completion_tokens += sum(counts)
            if not finished:  # the client went away: the generator was closed, the gRPC stream cancelled
                self.metrics.cancelled += 1
                await stream.aclose()


    def _echo_chunk(self, sse: Events, asked: Prepared, index: int, prompt: str, arrays: Optional[dict]) -> bytes:
        """A streamed completion's echoed prompt: its text, and its tokens' log probabilities when asked."""
        if asked.logprobs is None:
            return sse.content(index, prompt)
        return sse.chunk(index, prompt, completion_logprobs(self.texts, self._prompt_logprobs(asked, arrays),
                                                            asked.logprobs))


class _EventStream(StreamingResponse):
    """A streamed answer that closes its events when sent or abandoned (a send to a client that went away
    raises), so the request's life ends with the response, not when the generator is collected."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


# ---- server-sent events --------------------------------------------------------------------------------------

DONE = b"data: [DONE]\n\n"


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


class Events:
    """The server-sent events of one streamed completion: ``chat.completion.chunk`` (``chat``) or
    ``text_completion`` chunks of one choice each, all with one ``created`` (as OpenAI's), ``"usage": null`` on
    each when ``include_usage`` (the last, :meth:`usage`, carries it)."""

    def __init__(self, rid: str, model: str, chat: bool, include_usage: bool):
        self.rid, self.model, self.chat, self.include_usage = rid, model, chat, include_usage
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.created = int(time.time())
        self._head = (f'data: {{"id":"{rid}","object":"{self.object}","created":{self.created},"model":'
                      f'{json.dumps(model)},"choices":[{{"index":')
        self._tail = ',"logprobs":null,"finish_reason":null}]' + (',"usage":null' if include_usage else "") + "}\n\n"
        self._key = ',"delta":{"content":' if chat else ',"text":'
        self._close = "}" if chat else ""

    def content(self, index: int, text: str) -> bytes:
        """New text of choice ``index``, written as :meth:`_chunk` would, without building and dumping the dict."""
        return (self._head + str(index) + self._key + json.dumps(text) + self._close + self._tail).encode()

    def chunk(self, index: int, text: str, logprobs: dict) -> bytes:
        """New text of choice ``index`` with the ``logprobs`` object of its tokens."""
        new = {"delta": {"content": text}} if self.chat else {"text": text}
        return self._chunk({"index": index, **new, "logprobs": logprobs, "finish_reason": None})

    def role(self, index: int) -> bytes:
        """Chat's first chunk of choice ``index``: the assistant's role, empty content."""
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def delta(self, index: int, delta: dict) -> bytes:
        """A chat chunk of choice ``index`` with this ``delta`` (``{"content": ...}`` or ``{"tool_calls": [...]}``)."""
        return self._chunk({"index": index, "delta": delta, "logprobs": None, "finish_reason": None})

    def finish(self, index: int, reason: str) -> bytes:
        """The last chunk of choice ``index``: no new text, the finish reason (``stop`` or ``length``)."""
        new = {"delta": {}} if self.chat else {"text": ""}
        return self._chunk({"index": index, **new, "logprobs": None, "finish_reason": reason})

    def usage(self, usage: dict) -> bytes:
        """``stream_options.include_usage``'s last chunk: no choices, the usage."""
        return _sse({"id": self.rid, "object": self.object, "created": self.created, "model": self.model,
                     "choices": [], "usage": usage})

    def _chunk(self, choice: dict) -> bytes:
        out = {"id": self.rid, "object": self.object, "created": self.created, "model": self.model,
               "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return _sse(out)


def _message(plan, text: str) -> dict:
    """A non-streamed chat answer's message: the text, or the tool calls in it (``plan``: the request's
    pipeline.openai_tools.ToolPlan, None without tools): a forced call (tool_choice "required" or a named function)
    read from the JSON its schema made the model write, an ``auto`` one in the model's own tool-call format; text
    that holds no call stays the content."""
    from pipeline.openai_tools import new_call_id, parse_forced, parse_tool_calls

    if plan is None:
        return {"role": "assistant", "content": text}
    if plan.schema is not None:
        found = [dict(call, id=new_call_id(plan.fmt)) for call in parse_forced(text, plan.tools, plan.tool_choice)]
        content = None if found else text  # ids as the template's format wants them back (Mistral: 9 characters)
    else:
        content, found = parse_tool_calls(plan.fmt, text)
        content = content if found else text  # no call: the answer as it came ("" stays "")
    message = {"role": "assistant", "content": content}
    if found:
        message["tool_calls"] = found
    return message


class _ToolCalls:
    """One streamed chat choice with tools: an ``auto`` answer read as it streams (pipeline.openai_tools
    ToolCallStream: content while no call has started, each call as it completes); a forced one kept until the
    end (its JSON is one call, or several, only when whole) and said then, as content where it holds no call."""

    def __init__(self, plan):
        from pipeline.openai_tools import ToolCallStream

        self.plan, self.called, self._text = plan, False, ""
        self._stream = ToolCallStream(plan.fmt) if plan.schema is None else None

    def feed(self, text: str) -> list[dict]:
        if self._stream is None:
            self._text += text
            return []
        return self._seen(self._stream.feed(text)) if text else []

    def finish(self) -> list[dict]:
        if self._stream is not None:
            return self._seen(self._stream.finish())
        message = _message(self.plan, self._text)
        if not message.get("tool_calls"):
            return [{"content": self._text}] if self._text else []
        self.called = True
        return [{"tool_calls": [dict(call, index=i) for i, call in enumerate(message["tool_calls"])]}]

    def _seen(self, payloads: list[dict]) -> list[dict]:
        self.called = self.called or any("tool_calls" in p for p in payloads)
        return payloads


def _finish(tokens: int, max_tokens: int, stopped: bool = False, generate: bool = True) -> str:
    """``stop`` (a stop string, or the model ended before max_tokens) or ``length``; ``length`` for echo's
    max_tokens 0 (``generate`` False: the limit ended it)."""
    return "length" if not generate else "stop" if stopped or tokens < max_tokens else "length"


async def _copied(deltas: AsyncIterator[Delta], copies: int) -> AsyncIterator[Delta]:
    """Each delta as ``copies`` choices (0 ... copies-1): a greedy answer asked for ``n`` > 1 times; with
    ``copies`` 1, the deltas as they are (sampled ``n`` > 1: each carries its own sequence index)."""
    async for d in deltas:
        if copies == 1:
            yield d
            continue
        for i in range(copies):
            yield Delta(i, d.text, d.tokens, d.logprobs, d.prompt)


async def _stopping(deltas: AsyncIterator[Delta], stream: AsyncIterator[Delta], stops: list[str], n: int,
                    stopped: set[int]) -> AsyncIterator[Delta]:
    """``deltas`` with the ``stop`` strings applied to each choice's text (:class:`StopMatcher`: matched on the
    decoded text, left out of the answer); a choice that hit one is added to ``stopped`` and gets no more text.
    Once all ``n`` have stopped, ``stream`` is closed, which cancels the request in Triton."""
    if not stops:
        async for d in deltas:
            yield d
        return
    matchers = [StopMatcher(stops) for _ in range(n)]
    async for d in deltas:
        if d.index in stopped:
            continue
        text = matchers[d.index].push(d.text)
        if matchers[d.index].stopped:
            stopped.add(d.index)
        yield Delta(d.index, text, d.tokens, d.logprobs, d.prompt)
        if len(stopped) == n:
            await stream.aclose()
            return
    for i, m in enumerate(matchers):
        if tail := m.flush():
            yield Delta(i, tail, 0)


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _prepend(first: Optional[Delta], rest: AsyncIterator[Delta]) -> AsyncIterator[Delta]:
    """``first`` (when not None), then ``rest``."""
    if first is not None:
        yield first
    async for d in rest:
        yield d


# ---- a client that goes away ---------------------------------------------------------------------------------


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
                await asyncio.wait({nxt})  # let the cancel land first: closing `it` while it runs raises
                raise _Disconnected()
    finally:
        watcher.cancel()
        await it.aclose()


async def _wait_disconnect(request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _nth(i: int, n: int, fn, *args):
    """``fn(*args)`` for prompt ``i`` of ``n`` in one completion request: its APIError names which prompt (index from
    0, as the choices' order), when there are several."""
    try:
        return fn(*args)
    except APIError as err:
        if n > 1:
            err.message = f"prompt[{i}] (of {n}): {err.message}"
            err.args = (err.message,)
        raise
