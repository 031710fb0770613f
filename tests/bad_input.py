"""Malformed requests for every model of the repository and for the OpenAI frontend, and a bounded fuzz loop.

One table for ``tests/test_bad_requests.py`` and ``scripts/bench/bench_bad_input.py``: :data:`KINDS` (kind ->
the models it applies to and, per model, the request and the field its error must name) and :data:`OPENAI_KINDS`.
:func:`run_case` sends one kind to one model (gRPC streaming for decoupled models, HTTP and gRPC for the others,
always with a client timeout), checks the error, then sends a good request to the same model and checks its
answer ("Paris" for the capital of France). :func:`fuzz` sends seeded random tensors and random JSON.
"""

from __future__ import annotations

import http.client
import json
import queue
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")
DECOUPLED = ("tensorrt_llm", "ensemble", "tensorrt_llm_bls")
"""Answered over a gRPC stream; the others over HTTP and gRPC."""
GENERATORS = ("ensemble", "tensorrt_llm_bls")
"""Text in, text out: the client-facing models."""
SAMPLERS = GENERATORS + ("tensorrt_llm",)
"""The models that take the decoding options."""
TEXT_IN = GENERATORS + ("preprocessing",)
QUESTION = "What is the capital of France?"
ANSWER = "The capital of France is Paris."
LEAD = "The capital of France is"
"""The good request: the question through the chat template with the answer begun, so that greedy decoding says
" Paris" at once (a good request after every case costs two tokens, not eight)."""
GOOD_MAX_TOKENS = 2
TIMEOUT_S = 30.0
"""Longest wait for any response: a request that gets nothing for this long hung."""
MODEL_ID = "smollm2-135m"
"""The OpenAI frontend's model id (the build name)."""

NAMES = {  # a role -> each model's input for it
    "text": {"ensemble": "text_input", "tensorrt_llm_bls": "text_input", "preprocessing": "QUERY"},
    "max_tokens": {"ensemble": "max_tokens", "tensorrt_llm_bls": "max_tokens", "preprocessing": "REQUEST_OUTPUT_LEN",
                   "tensorrt_llm": "request_output_len"},
    "stop_words": {"ensemble": "stop_words", "tensorrt_llm_bls": "stop_words", "preprocessing": "STOP_WORDS_DICT",
                   "tensorrt_llm": "stop_words_list"},
    "top_k": {"ensemble": "top_k", "tensorrt_llm_bls": "top_k", "tensorrt_llm": "runtime_top_k"},
    "top_p": {"ensemble": "top_p", "tensorrt_llm_bls": "top_p", "tensorrt_llm": "runtime_top_p"},
    "stream": {"ensemble": "stream", "tensorrt_llm_bls": "stream", "tensorrt_llm": "streaming"},
}
TRACEBACK_MARKS = ("Traceback", "\nAt:", "internal error", "Failed to process the request")
"""In an error text: an exception escaped the model (the Python backend's wrapper), not a validation message."""
STUB_TROUBLE = re.compile(r"[Ss]tub process.*(unhealthy|not healthy|restart)|Failed to restart the stub|"
                          r"Error in generation loop|background thread died|the engine worker exited")
"""Server-log lines of a Python-backend stub found unhealthy or restarted (Triton 2.51's python_be.cc), or of the
runtime's generation loop / engine worker dying."""


# ---- requests --------------------------------------------------------------------------------------------------


def i32(v):
    return np.array([[v]], np.int32), "INT32"


def f32(v):
    return np.array([[v]], np.float32), "FP32"


def text(b: bytes, shape=(1, 1)):
    return np.array([b] * int(np.prod(shape)), dtype=object).reshape(shape), "BYTES"


def boolean(v):
    return np.array([[v]], bool), "BOOL"


@dataclass
class Context:
    """What the requests are made of: the model's tokenizer and the chat-formatted question."""

    tokenizer: object
    prompt: str
    """The chat-formatted question with the answer begun (:data:`LEAD`)."""
    prompt_ids: list
    answer_ids: list

    @classmethod
    def load(cls, engine_dir: Path) -> "Context":
        from transformers import AutoTokenizer

        from pipeline.client import format_chat

        tok = AutoTokenizer.from_pretrained(str(engine_dir), local_files_only=True)
        prompt = format_chat(engine_dir, QUESTION) + LEAD
        return cls(tok, prompt, tok.encode(prompt), tok.encode(ANSWER, add_special_tokens=False))

    @property
    def vocab(self) -> int:
        return len(self.tokenizer)

    def good(self, model: str) -> dict:
        """The inputs of a request ``model`` answers correctly: input name -> (array, Triton dtype)."""
        if model in GENERATORS:
            return {"text_input": text(self.prompt.encode()), "max_tokens": i32(GOOD_MAX_TOKENS),
                    "stream": boolean(True)}
        if model == "preprocessing":
            return {"QUERY": text(self.prompt.encode()), "REQUEST_OUTPUT_LEN": i32(GOOD_MAX_TOKENS)}
        if model == "tensorrt_llm":
            ids = np.array([self.prompt_ids], np.int32)
            return {"input_ids": (ids, "INT32"), "input_lengths": i32(ids.shape[1]),
                    "request_output_len": i32(GOOD_MAX_TOKENS), "streaming": boolean(True)}
        if model == "postprocessing":
            ids = np.array([[self.answer_ids]], np.int32)
            return {"TOKENS_BATCH": (ids, "INT32"), "SEQUENCE_LENGTH": i32(len(self.answer_ids))}
        raise KeyError(model)

    def answered(self, model: str, outputs: list[dict]) -> str | None:
        """None when ``outputs`` (one dict per response) are the good request's right answer, else what is wrong."""
        def joined(name):
            return [x for o in outputs if o.get(name) is not None for x in o[name].reshape(-1)]

        if model in GENERATORS:
            got = b"".join(joined("text_output")).decode(errors="replace")
            return None if "Paris" in got else f"no 'Paris' in {got!r}"
        if model == "tensorrt_llm":
            got = self.tokenizer.decode([int(t) for t in joined("output_ids")], skip_special_tokens=True)
            return None if "Paris" in got else f"no 'Paris' in {got!r}"
        if model == "preprocessing":
            n = int(joined("REQUEST_INPUT_LEN")[0]) if joined("REQUEST_INPUT_LEN") else -1
            got = self.tokenizer.decode([int(t) for t in joined("INPUT_ID")[:n]])
            return None if got.endswith(self.prompt) else f"the prompt's ids decode to {got!r}"  # a BOS may lead
        if model == "postprocessing":
            got = b"".join(joined("OUTPUT")).decode(errors="replace")
            return None if got == ANSWER else f"{got!r} is not {ANSWER!r}"
        raise KeyError(model)


@dataclass
class Case:
    """One malformed request: its inputs, the names its error must mention (any of them, case-insensitive)."""

    inputs: dict
    fields: tuple
    request_id: str | None = None  # None: a fresh id


@dataclass
class Kind:
    name: str
    what: str
    models: tuple
    build: Callable[[str, Context], Case]
    limits: dict = field(default_factory=dict)
    """model -> why the server cannot refuse this kind there (Triton's own behaviour): no error is required, only
    no hang, no traceback and the next request answered."""


KINDS: dict[str, Kind] = {}


def _kind(models, what, limits=None):
    def register(fn):
        KINDS[fn.__name__] = Kind(fn.__name__, what, tuple(models), fn, dict(limits or {}))
        return fn
    return register


def _with(base: dict, **changes) -> dict:
    """``base`` with inputs replaced, added, or (value None) left out."""
    out = dict(base)
    for name, value in changes.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


def _case(ctx, model, fields, **changes):
    return Case(_with(ctx.good(model), **changes), tuple(fields) if isinstance(fields, (tuple, list)) else (fields,))


REQUIRED = {"ensemble": "max_tokens", "tensorrt_llm_bls": "max_tokens", "preprocessing": "REQUEST_OUTPUT_LEN",
            "tensorrt_llm": "input_lengths", "postprocessing": "SEQUENCE_LENGTH"}
FIRST = {"ensemble": "text_input", "tensorrt_llm_bls": "text_input", "preprocessing": "QUERY",
         "tensorrt_llm": "input_ids", "postprocessing": "TOKENS_BATCH"}


@_kind(MODELS, "a required input left out (fewer inputs than required: Triton's check)")
def missing_required_input(model, ctx):
    return _case(ctx, model, REQUIRED[model], **({REQUIRED[model]: None, "streaming": None, "stream": None}))


@_kind(TEXT_IN + ("tensorrt_llm",), "a required input left out, an optional one sent (the model's check)",
       limits={"ensemble": "Triton 2.51 checks required inputs by their number only; the ensemble then never starts "
                           "its first step and ends the request with an empty response and no error (upstream's "
                           "ensemble declares text_input required alike)"})
def missing_input_optional_sent(model, ctx):
    extra = {"END_ID": i32(2)} if model == "preprocessing" else {}
    return _case(ctx, model, FIRST[model], **{FIRST[model]: None}, **extra)


@_kind(MODELS, "FP32 where the config says INT32")
def fp32_for_int32(model, ctx):
    name = NAMES["max_tokens"].get(model, FIRST[model])
    arr = ctx.good(model)[name][0].astype(np.float32)
    return _case(ctx, model, name, **{name: (arr, "FP32")})


@_kind(TEXT_IN, "INT32 where the config says BYTES")
def int32_for_bytes(model, ctx):
    return _case(ctx, model, NAMES["text"][model], **{NAMES["text"][model]: i32(7)})


@_kind(SAMPLERS, "INT32 where the config says BOOL")
def int32_for_bool(model, ctx):
    return _case(ctx, model, NAMES["stream"][model], **{NAMES["stream"][model]: i32(1)})


@_kind(MODELS, "an input of the wrong rank")
def wrong_rank(model, ctx):
    name = FIRST[model]
    arr, dtype = ctx.good(model)[name]
    return _case(ctx, model, name, **{name: (arr.reshape(arr.shape[1:]) if model == "postprocessing"
                                             else arr[..., None], dtype)})


@_kind(MODELS, "inputs of different batch sizes")
def batch_size_mismatch(model, ctx):
    name = FIRST[model]
    arr, dtype = ctx.good(model)[name]
    case = _case(ctx, model, (), **{name: (np.concatenate([arr, arr]), dtype)})
    case.fields = tuple(case.inputs)  # Triton names the first input whose batch differs from the others'
    return case


@_kind(MODELS, "a batch above max_batch_size")
def batch_above_max(model, ctx):
    return Case({n: (np.concatenate([a] * 9), d) for n, (a, d) in ctx.good(model).items()},
                ("batch-size", "max_batch_size"))


@_kind(MODELS, "an empty tensor (zero-size dimension)")
def empty_tensor(model, ctx):
    if model == "tensorrt_llm":
        return _case(ctx, model, "input_ids", input_ids=(np.zeros((1, 0), np.int32), "INT32"), input_lengths=i32(0))
    if model == "postprocessing":
        return _case(ctx, model, "SEQUENCE_LENGTH", SEQUENCE_LENGTH=(np.zeros((1, 0), np.int32), "INT32"))
    name = NAMES["text"][model]
    return _case(ctx, model, name, **{name: text(b"", (1, 0))})


@_kind(MODELS, "an input name the model does not have")
def unknown_input(model, ctx):
    return _case(ctx, model, "no_such_input", no_such_input=i32(1))


@_kind(TEXT_IN + ("tensorrt_llm",), "max_tokens / request_output_len 0")
def max_tokens_zero(model, ctx):
    return _case(ctx, model, NAMES["max_tokens"][model], **{NAMES["max_tokens"][model]: i32(0)})


@_kind(TEXT_IN + ("tensorrt_llm",), "max_tokens / request_output_len negative")
def max_tokens_negative(model, ctx):
    return _case(ctx, model, NAMES["max_tokens"][model], **{NAMES["max_tokens"][model]: i32(-5)})


@_kind(TEXT_IN + ("tensorrt_llm",), "max_tokens / request_output_len 2**31-1")
def max_tokens_huge(model, ctx):
    return _case(ctx, model, NAMES["max_tokens"][model], **{NAMES["max_tokens"][model]: i32(2**31 - 1)})


@_kind(("tensorrt_llm",), "input_lengths above the ids input_ids holds")
def input_lengths_disagree(model, ctx):
    return _case(ctx, model, "input_lengths", input_lengths=i32(len(ctx.prompt_ids) + 50))


@_kind(("tensorrt_llm",), "a token id past the vocabulary")
def token_id_out_of_vocab(model, ctx):
    return _case(ctx, model, "input_ids", input_ids=(np.array([[1, ctx.vocab + 1000]], np.int32), "INT32"),
                 input_lengths=i32(2))


@_kind(("tensorrt_llm", "postprocessing"), "a negative token id")
def token_id_negative(model, ctx):
    if model == "postprocessing":
        return _case(ctx, model, "TOKENS_BATCH", TOKENS_BATCH=(np.array([[[504, -5]]], np.int32), "INT32"),
                     SEQUENCE_LENGTH=i32(2))
    return _case(ctx, model, "input_ids", input_ids=(np.array([[1, -3]], np.int32), "INT32"), input_lengths=i32(2))


@_kind(("postprocessing",), "SEQUENCE_LENGTH above the tokens TOKENS_BATCH holds")
def sequence_length_out_of_range(model, ctx):
    return _case(ctx, model, "SEQUENCE_LENGTH", SEQUENCE_LENGTH=i32(len(ctx.answer_ids) + 9))


@_kind(TEXT_IN, "bytes that are not UTF-8 in the prompt")
def non_utf8_text(model, ctx):
    return _case(ctx, model, NAMES["text"][model], **{NAMES["text"][model]: text(b"caf\xe9 \xff\xfe")})


@_kind(TEXT_IN, "bytes that are not UTF-8 in stop_words")
def non_utf8_stop_words(model, ctx):
    return _case(ctx, model, NAMES["stop_words"][model], **{NAMES["stop_words"][model]: text(b"\xc3")})


@_kind(TEXT_IN + ("tensorrt_llm",), "a prompt above max_input_len")
def huge_prompt(model, ctx):
    if model == "tensorrt_llm":
        ids = np.full((1, 3000), ctx.prompt_ids[-1], np.int32)
        return _case(ctx, model, "input_ids", input_ids=(ids, "INT32"), input_lengths=i32(3000))
    return _case(ctx, model, NAMES["text"][model], **{NAMES["text"][model]: text(b"word " * 3000)})


@_kind(SAMPLERS, "temperature < 0")
def temperature_negative(model, ctx):
    return _case(ctx, model, "temperature", temperature=f32(-1.0))


@_kind(SAMPLERS, "temperature NaN")
def temperature_nan(model, ctx):
    return _case(ctx, model, "temperature", temperature=f32(float("nan")))


@_kind(SAMPLERS, "top_p > 1")
def top_p_above_one(model, ctx):
    return _case(ctx, model, "top_p", **{NAMES["top_p"][model]: f32(1.5)})


@_kind(SAMPLERS, "top_k < 0")
def top_k_negative(model, ctx):
    return _case(ctx, model, "top_k", **{NAMES["top_k"][model]: i32(-1)})


@_kind(SAMPLERS, "beam_width 2 (no beam search)")
def beam_width_above_one(model, ctx):
    return _case(ctx, model, "beam_width", beam_width=i32(2))


@_kind(SAMPLERS, "num_return_sequences 0")
def num_return_sequences_zero(model, ctx):
    return _case(ctx, model, "num_return_sequences", num_return_sequences=i32(0))


@_kind(SAMPLERS, "min_tokens above max_tokens")
def min_tokens_above_max(model, ctx):
    return _case(ctx, model, "min_tokens", min_tokens=i32(GOOD_MAX_TOKENS + 9))


@_kind(SAMPLERS, "num_top_logprobs above 20 (the log-prob inputs beyond upstream's interface)")
def num_top_logprobs_above_limit(model, ctx):
    return _case(ctx, model, "num_top_logprobs", num_top_logprobs=i32(21))


@_kind(SAMPLERS, "end_id below -1")
def end_id_out_of_range(model, ctx):
    return _case(ctx, model, "end_id", end_id=i32(-7))


@_kind(TEXT_IN + ("tensorrt_llm",), "stop words of the wrong shape")
def stop_words_wrong_shape(model, ctx):
    name = NAMES["stop_words"][model]
    value = (np.ones((1, 3, 2), np.int32), "INT32") if model == "tensorrt_llm" else text(b"x", (1, 1, 1))
    return _case(ctx, model, name, **{name: value})


@_kind(("tensorrt_llm",), "a bad word's token id past the vocabulary")
def bad_words_out_of_vocab(model, ctx):
    words = np.array([[[ctx.vocab + 7, 0], [1, -1]]], np.int32)
    return _case(ctx, model, "bad_words_list", bad_words_list=(words, "INT32"))


@_kind(("tensorrt_llm",), "a negative bad word token id")
def bad_words_negative(model, ctx):
    return _case(ctx, model, "bad_words_list", bad_words_list=(np.array([[[-5, 0], [1, -1]]], np.int32), "INT32"))


@_kind(SAMPLERS + ("preprocessing",), "embedding bias that does not fit (words vs weights, or past the vocabulary)")
def embedding_bias_mismatch(model, ctx):
    if model == "tensorrt_llm":
        return _case(ctx, model, "embedding_bias", embedding_bias=(np.ones((1, ctx.vocab + 10), np.float32), "FP32"))
    words, weights = (("EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS_WEIGHTS") if model == "preprocessing"
                      else ("embedding_bias_words", "embedding_bias_weights"))
    return _case(ctx, model, (words,), **{words: text(b"Paris", (1, 2)),
                                          weights: (np.array([[1.0]], np.float32), "FP32")})


@_kind(("tensorrt_llm",), "stop = true without a request id")
def stop_without_request_id(model, ctx):
    case = _case(ctx, model, ("stop", "request_id"), stop=boolean(True))
    case.request_id = ""
    return case


def cases() -> list[tuple[str, str]]:
    """Every (kind, model) pair of the table."""
    return [(k.name, m) for k in KINDS.values() for m in MODELS if m in k.models]


# ---- sending -------------------------------------------------------------------------------------------------


@dataclass
class Reply:
    """What one request got: the error text (None: answered), the responses' outputs, or that it hung."""

    error: str | None = None
    outputs: list = field(default_factory=list)
    hung: bool = False
    protocol: str = ""


@dataclass
class Server:
    """Where the requests go: Triton's gRPC ``host:port``, its HTTP ``host:port``, the frontend's base URL."""

    grpc_url: str
    http_url: str
    frontend_url: str | None = None


def _infer_inputs(inputs: dict, client_mod):
    out = []
    for name, (arr, dtype) in inputs.items():
        t = client_mod.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def send(server: Server, model: str, inputs: dict, protocol: str, request_id: str | None = None,
         timeout_s: float = TIMEOUT_S) -> Reply:
    """One request over ``protocol`` ("stream": gRPC stream until the final response; "grpc"; "http")."""
    from tritonclient.utils import InferenceServerException

    rid = uuid.uuid4().hex if request_id is None else request_id
    if protocol == "http":
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(server.http_url, connection_timeout=timeout_s,
                                                  network_timeout=timeout_s)
        try:
            result = client.infer(model, _infer_inputs(inputs, httpclient), request_id=rid)
            return Reply(outputs=[{o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}],
                         protocol=protocol)
        except InferenceServerException as exc:
            return Reply(error=exc.message(), protocol=protocol)
        except Exception as exc:  # the socket timed out: the request hung
            return Reply(error=f"{type(exc).__name__}: {exc}", hung="timed out" in str(exc).lower()
                         or isinstance(exc, TimeoutError), protocol=protocol)
        finally:
            client.close()
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        if protocol == "grpc":
            try:
                result = client.infer(model, _infer_inputs(inputs, grpcclient), request_id=rid,
                                      client_timeout=timeout_s)
            except InferenceServerException as exc:
                return Reply(error=exc.message(), hung="DEADLINE" in str(exc.status()).upper(), protocol=protocol)
            return Reply(outputs=[{o.name: result.as_numpy(o.name) for o in result.get_response().outputs}],
                         protocol=protocol)
        got: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, _infer_inputs(inputs, grpcclient), request_id=rid,
                                  enable_empty_final_response=True)
        reply = Reply(protocol=protocol)
        while True:
            try:
                result, error = got.get(timeout=timeout_s)
            except queue.Empty:
                reply.hung = True
                client.stop_stream(cancel_requests=True)
                return reply
            if error is not None:
                reply.error = error.message() if hasattr(error, "message") else str(error)
                return reply
            resp = result.get_response()
            outs = {o.name: result.as_numpy(o.name) for o in resp.outputs}
            if outs:
                reply.outputs.append(outs)
            if resp.parameters["triton_final_response"].bool_param:
                return reply
    finally:
        # after its final response a request is never cancelled: cancelling a finished BLS request crashes
        # tritonserver 2.51 (TRITONBACKEND_ResponseFactoryIsCancelled; pipeline/openai_triton.py drains alike)
        if protocol == "stream":
            client.stop_stream(cancel_requests=False)
        client.close()


def protocols(model: str) -> tuple[str, ...]:
    return ("stream",) if model in DECOUPLED else ("http", "grpc")


def names_field(message: str, fields: tuple) -> bool:
    """Whether ``message`` names one of ``fields`` as a whole name (case-insensitive): bounded by anything but a
    letter, digit or underscore, as the messages write them (``'max_tokens'``, ``messages.0.role``, ``n = 99``,
    ``input_lengths:``). A field ``n`` is not named by "Internal Server Error", ``top_k`` not by ``runtime_top_k``."""
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(f)}(?![A-Za-z0-9_])", message, re.IGNORECASE)
               for f in fields)


def is_traceback(message: str) -> bool:
    return any(m in message for m in TRACEBACK_MARKS)


def run_case(server: Server, ctx: Context, kind: str, model: str) -> list[dict]:
    """Send ``kind`` to ``model`` over each of its protocols, each followed by a good request; one row each:
    error (got one, no hang), field (named in it), clean (no traceback), next (the good request answered right)."""
    case = KINDS[kind].build(model, ctx)
    rows = []
    for proto in protocols(model):
        t0 = time.perf_counter()
        bad = send(server, model, case.inputs, proto, request_id=case.request_id)
        seconds = time.perf_counter() - t0
        good = send(server, model, ctx.good(model), proto)
        wrong = good.error or ("hung" if good.hung else None) or ctx.answered(model, good.outputs)
        message = bad.error or ""
        rows.append({"kind": kind, "model": model, "protocol": proto, "fields": list(case.fields),
                     "limit": KINDS[kind].limits.get(model),
                     "error": bad.error is not None and not bad.hung, "hung": bad.hung,
                     "field": bad.error is not None and names_field(message, case.fields),
                     "clean": bad.error is not None and not is_traceback(message),
                     "next": wrong is None, "next_detail": wrong, "message": message, "seconds": round(seconds, 3)})
    return rows


# ---- the OpenAI frontend ---------------------------------------------------------------------------------------

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
_Q = [{"role": "user", "content": QUESTION}]


def _chat(**kw):
    return {"model": MODEL_ID, "messages": _Q, "max_tokens": GOOD_MAX_TOKENS, "temperature": 0, **kw}


OPENAI_KINDS: dict[str, tuple] = {  # kind -> (path, body: dict or raw bytes, statuses, field the message names)
    "malformed_json": (CHAT, b'{"model": "smollm2-135m", "messages": [', (400,), "JSON"),
    "body_not_an_object": (CHAT, b"[1, 2, 3]", (400,), "object"),
    "missing_messages": (CHAT, {"model": MODEL_ID, "max_tokens": 8}, (400, 422), "messages"),
    "empty_messages": (CHAT, _chat(messages=[]), (400, 422), "messages"),
    "messages_not_a_list": (CHAT, _chat(messages="hello"), (400, 422), "messages"),
    "content_wrong_type": (CHAT, _chat(messages=[{"role": "user", "content": 42}]), (400, 422), "messages"),
    "content_part_text_not_string": (CHAT, _chat(messages=[{"role": "user", "content": [{"type": "text",
                                                                                         "text": 42}]}]),
                                     (400, 422), "messages"),
    "unknown_role": (CHAT, _chat(messages=[{"role": "wizard", "content": "hi"}]), (400, 422), "role"),
    "lone_surrogate_in_content": (CHAT, b'{"model": "smollm2-135m", "max_tokens": 8, "messages": [{"role": "user", '
                                        b'"content": "hi \\ud800"}]}', (400,), "messages"),
    "max_tokens_negative": (CHAT, _chat(max_tokens=-1), (400, 422), "max_tokens"),
    "max_tokens_not_integer": (CHAT, _chat(max_tokens="ten"), (400, 422), "max_tokens"),
    "max_tokens_above_context": (CHAT, _chat(max_tokens=10**9), (400,), "max_tokens"),
    "n_above_limit": (CHAT, _chat(n=99), (400,), "n"),
    "logit_bias_not_supported": (CHAT, _chat(logit_bias={"5": 10}), (400,), "logit_bias"),
    "tools_with_auto_choice": (CHAT, _chat(tools=[{"type": "function", "function": {"name": "f"}}]), (400,), "tool_choice"),
    "unknown_model": (CHAT, _chat(model="no-such-model"), (404,), "model"),
    "stream_not_bool": (CHAT, _chat(stream="yes"), (400, 422), "stream"),
    "temperature_out_of_range": (CHAT, _chat(temperature=5.0), (400, 422), "temperature"),
    "top_p_above_one": (CHAT, _chat(top_p=1.5), (400, 422), "top_p"),
    "seed_above_uint64": (CHAT, _chat(seed=2**70), (400, 422), "seed"),
    "response_format_not_object": (CHAT, _chat(response_format="json"), (400, 422), "response_format"),
    "min_tokens_above_max_tokens": (CHAT, _chat(min_tokens=100), (400,), "min_tokens"),
    "huge_prompt": (CHAT, _chat(messages=[{"role": "user", "content": "word " * 3000}]), (400,), "messages"),
    # longer in characters than max_input_len (1024) tokens can be (x 81): refused before tokenizing
    "prompt_longer_than_any_token_count": (CHAT, _chat(messages=[{"role": "user", "content": "a" * 100_000}]),
                                           (400,), "messages"),
    # over the body limit (1 MiB + 64 B x max_input_len = 1,114,112 bytes): 413 from its Content-Length
    "body_too_large": (COMPLETIONS, json.dumps({"model": MODEL_ID, "prompt": "a " * 600_000}).encode(), (413,),
                       "body"),
    "top_logprobs_without_logprobs": (CHAT, _chat(top_logprobs=2), (400,), "top_logprobs"),
    "top_logprobs_above_limit": (CHAT, _chat(logprobs=True, top_logprobs=21), (400, 422), "top_logprobs"),
    "completion_logprobs_above_limit": (COMPLETIONS, {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2,
                                                      "logprobs": 21}, (400, 422), "logprobs"),
    "completion_max_tokens_zero_without_echo": (COMPLETIONS, {"model": MODEL_ID, "prompt": "Hi", "max_tokens": 0},
                                                (400,), "max_tokens"),
    "completion_prompt_empty": (COMPLETIONS, {"model": MODEL_ID, "prompt": "", "max_tokens": 8}, (400,), "prompt"),
    "completion_prompt_not_string": (COMPLETIONS, {"model": MODEL_ID, "prompt": 7, "max_tokens": 8}, (400, 422),
                                     "prompt"),
    "completion_prompt_ids_outside_vocabulary": (COMPLETIONS, {"model": MODEL_ID, "prompt": [1, 10**7],
                                                               "max_tokens": 8}, (400,), "prompt"),
    "completion_several_prompts_streamed": (COMPLETIONS, {"model": MODEL_ID, "prompt": ["a", "b"], "max_tokens": 8,
                                                           "stream": True}, (400,), "prompt"),
    "stop_lone_surrogate": (COMPLETIONS, b'{"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 4, "stop": '
                                         b'["\\udc80"]}', (400,), "stop"),
}


def post(base_url: str, path: str, body, timeout_s: float = TIMEOUT_S) -> tuple[int, bytes]:
    """POST ``body`` (dict: JSON; bytes: as they are); the status and the whole body (a stream read to its end).
    Status 0: no answer within ``timeout_s`` (hung)."""
    host, port = base_url.split("//", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except TimeoutError:
        return 0, b""
    finally:
        conn.close()


def good_completion(server: Server, ctx: Context) -> str | None:
    """None when a completion of the chat-formatted question (the answer begun) says Paris, else what came."""
    status, raw = post(server.frontend_url, COMPLETIONS, {"model": MODEL_ID, "prompt": ctx.prompt, "temperature": 0,
                                                          "max_tokens": GOOD_MAX_TOKENS})
    answer = json.loads(raw)["choices"][0]["text"] if status == 200 else f"HTTP {status} {raw[:300]!r}"
    return None if "Paris" in answer else answer


def run_openai_case(server: Server, ctx: Context, kind: str) -> dict:
    """Send one OpenAI kind, then a good request; the row as :func:`run_case` makes them."""
    path, body, statuses, name = OPENAI_KINDS[kind]
    t0 = time.perf_counter()
    status, raw = post(server.frontend_url, path, body)
    seconds = time.perf_counter() - t0
    try:
        err = json.loads(raw)["error"]
        message = str(err["message"])
    except (ValueError, KeyError, TypeError):
        err, message = None, raw.decode(errors="replace")
    wrong = good_completion(server, ctx)
    return {"kind": kind, "model": "openai", "protocol": "http", "fields": [name],
            "error": status in statuses and err is not None, "hung": status == 0, "status": status,
            "field": err is not None and names_field(message, (name,)), "clean": status != 500 and err is not None,
            "next": wrong is None, "next_detail": wrong,
            "message": message, "seconds": round(seconds, 3)}


# ---- server state ----------------------------------------------------------------------------------------------


def start_served(engine_dir: Path, tmp: Path, repo: Path | None = None):
    """tritonserver on ``repo``, else on a repository generated into ``tmp`` from this checkout's templates and the
    built ``engine_dir`` (tests/model_repo/test_serving_options.py's way), and the OpenAI frontend in front of it:
    (TritonServer, OpenAIFrontend, Server)."""
    from builders.spec import load_spec
    from model_repo.generate import default_sys_path
    from pipeline.launch_config import frontend_launch
    from pipeline.serve import OpenAIFrontend, ServerConfig, TritonServer, free_ports
    from tests.conftest import DEFAULT_BUILD
    from tests.model_repo.test_serving_options import _start_server

    tmp.mkdir(parents=True, exist_ok=True)
    if repo is None:
        srv = _start_server(engine_dir, tmp)
    else:
        http_port, grpc_port, metrics_port = free_ports(3)
        srv = TritonServer(ServerConfig(model_repository=repo, http_port=http_port, grpc_port=grpc_port,
                                        metrics_port=metrics_port, log_file=tmp / "tritonserver.log",
                                        ready_timeout_s=300, python_path=default_sys_path())).start()
    launch = frontend_launch(load_spec(DEFAULT_BUILD, "cpu"), srv.cfg, free_ports(1)[0], engine_dir)
    launch.log_file = tmp / "openai_frontend.log"
    try:
        fe = OpenAIFrontend(launch).start()
    except BaseException:
        srv.stop()
        raise
    return srv, fe, Server(srv.cfg.grpc_url, f"127.0.0.1:{srv.cfg.http_port}", launch.url)


def stub_processes(server_pid: int) -> set[tuple[int, float]]:
    """(pid, start time) of every process under tritonserver (Python-backend stubs, the engine worker): a stub
    that was restarted shows up as a new pair."""
    import psutil

    return {(p.pid, p.create_time()) for p in psutil.Process(server_pid).children(recursive=True)}


def stub_trouble(log_text: str) -> list[str]:
    """The server-log lines that say a stub was unhealthy or restarted, or the generation loop died."""
    return [ln for ln in log_text.splitlines() if STUB_TROUBLE.search(ln)]


# ---- fuzz ------------------------------------------------------------------------------------------------------

DTYPES = ("INT32", "INT64", "UINT64", "FP32", "BOOL", "BYTES")
_NP = {"INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32, "BOOL": bool}
BOUNDED = {"max_tokens": 16, "request_output_len": 16, "min_tokens": 16}
"""Inputs whose valid values make the server generate that much: kept small so no fuzz request runs long."""
_CATEGORIES = (("data-type is", "triton: wrong dtype"), ("unexpected shape", "triton: wrong shape"),
               ("missing required input", "triton: missing input"),
               ("unexpected inference input", "triton: unknown input"),
               ("batch size does not match", "triton: batch sizes differ"),
               ("batch-size must be", "triton: batch above max_batch_size"),
               ("inputs but got", "triton: number of inputs"),
               ("byte size mismatch", "triton: byte size"), ("string elements", "triton: byte size"),
               ("unable to parse", "triton: bad tensor bytes"))


def category(message: str) -> str:
    """A short name for an error's kind: Triton's own checks by what they say, the models' by the field named."""
    for needle, name in _CATEGORIES:
        if needle in message:
            return name
    m = re.sub(r"^(\[request id: [^]]*\] )?(in ensemble '[^']*', )?", "", message)
    word = re.match(r"[A-Za-z_]+", m)
    return "model: " + (word.group(0) if word else m[:30])


def model_inputs(server: Server) -> dict:
    """model -> (max_batch_size, [(name, Triton dtype, dims, optional)]) from the server's model configs."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        out = {}
        for model in MODELS:
            cfg = client.get_model_config(model, as_json=True)["config"]
            out[model] = (int(cfg.get("max_batch_size", 0)),
                          [(i["name"], i["data_type"].replace("TYPE_", "").replace("STRING", "BYTES"),
                            [int(d) for d in i["dims"]], bool(i.get("optional", False))) for i in cfg["input"]])
        return out
    finally:
        client.close()


def _values(rng, name, dtype, shape, vocab):
    n = int(np.prod(shape))
    if dtype == "BYTES":
        pick = rng.integers(4)
        items = [bytes(rng.integers(0, 256, rng.integers(0, 24)).astype(np.uint8)) if pick == 0 else
                 ("word " * int(rng.integers(0, 6))).encode() if pick == 1 else
                 rng.choice(["Hello", "Paris", "", " ", "\u00e9t\u00e9", "\x00", "Once upon a time"]).encode()
                 for _ in range(n)]
        return np.array(items, dtype=object).reshape(shape)
    if dtype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == "FP32":
        pool = np.array([0.0, 0.5, 1.0, 1.5, -1.0, 2.0, 1e30, -1e30, np.nan, np.inf, -np.inf], np.float32)
        return np.where(rng.random(shape) < 0.5, rng.choice(pool, shape), rng.normal(0, 2, shape)).astype(np.float32)
    info = np.iinfo(_NP[dtype])

    def ints(values):
        return np.array([v for v in values if info.min <= v <= info.max], dtype=_NP[dtype])

    if name in BOUNDED:
        return rng.choice(ints([-(2**31), -1, 0, 1, 2, 4, BOUNDED[name], 2**31 - 1]), shape)
    small = rng.integers(0, 8, shape).astype(_NP[dtype])
    wide = rng.integers(max(int(info.min), -5), vocab + 100, shape, dtype=np.int64).astype(_NP[dtype])
    edges = rng.choice(ints([0, 1, 2, vocab - 1, vocab, -1, -2, int(info.max), int(info.min)]), shape)
    r = rng.random(shape)
    return np.where(r < 0.45, small, np.where(r < 0.85, wide, edges))


def random_request(rng, model: str, spec, vocab: int) -> dict:
    """Random tensors for ``model``: its required inputs and some optional ones, of its config's dtypes and ranks
    with random sizes and values; half of the requests also get one or two structural faults (an input of another
    dtype, rank, batch size or fixed dimension, a required input left out, an unknown input name)."""
    max_batch, inputs = spec
    batch = 1 if rng.random() < 0.8 else int(rng.integers(1, max_batch + 1))
    chosen = [i for i in inputs if rng.random() < (0.25 if i[3] else 1.0)]
    shapes = {name: [batch] + [(int(rng.integers(0, 7)) if rng.random() < 0.97 else int(rng.integers(500, 1500)))
                               if d < 0 else d for d in dims] for name, _, dims, _ in chosen}
    dtypes = {name: dtype for name, dtype, _, _ in chosen}
    for _ in range(int(rng.integers(1, 3)) if rng.random() < 0.5 and chosen else 0):
        if not shapes:
            break
        name = list(shapes)[int(rng.integers(len(shapes)))]
        fault = int(rng.integers(6))
        if fault == 0:
            dtypes[name] = str(rng.choice(DTYPES))
        elif fault == 1:
            shapes[name][0] = int(rng.integers(0, max_batch + 3))
        elif fault == 2:
            shapes[name] = shapes[name][:-1] if rng.random() < 0.5 else shapes[name] + [1]
        elif fault == 3 and len(shapes[name]) > 1:
            shapes[name][-1] = int(rng.integers(0, 4))
        elif fault == 4:
            shapes.pop(name)
        else:
            unknown = "fuzz_" + str(rng.integers(100))
            shapes[unknown], dtypes[unknown] = [batch, 1], "INT32"
    return {name: (_values(rng, name, dtypes.get(name, "INT32"), tuple(shape), vocab), dtypes.get(name, "INT32"))
            for name, shape in shapes.items()}


def random_body(rng) -> tuple[str, object]:
    """A random request for the OpenAI frontend: random bytes at times, else JSON with the known fields (and
    others) holding random values; max_tokens always small or invalid, so no request runs long."""
    path = CHAT if rng.random() < 0.7 else COMPLETIONS
    if rng.random() < 0.08:
        return path, bytes(rng.integers(0, 256, rng.integers(0, 64)).astype(np.uint8))
    junk = [None, True, 0, -1, 1.5, float(2**70), "x", "", [], {}, [1, "a"], {"a": 1}, "\u00e9"]

    def anything():
        return junk[int(rng.integers(len(junk)))]

    body: dict = {"model": MODEL_ID if rng.random() < 0.85 else anything(),
                  "max_tokens": [1, 4, 16, 0, -3, "8", 2.5, 10**12, "x"][int(rng.integers(9))]}
    if path == CHAT:
        roles = ["user", "system", "assistant", "wizard", None, 3]
        messages = [{"role": roles[int(rng.integers(len(roles)))] if rng.random() < 0.3 else "user",
                     "content": QUESTION if rng.random() < 0.5 else anything()}
                    for _ in range(int(rng.integers(0, 4)))]
        body["messages"] = messages if rng.random() < 0.85 else anything()
    else:
        body["prompt"] = "The capital of France is" if rng.random() < 0.6 else anything()
    options = {"temperature": [0, 0.7, -1, 3, "hot"], "top_p": [0.5, 1, 0, 2], "n": [1, 2, 0, 99, "2"],
               "stream": [True, False, "yes", 1], "stop": ["\n", ["a", "b"], 5, [None]], "seed": [1, -1, 2**70],
               "presence_penalty": [0, 5, "x"], "min_tokens": [0, 2, 100, -1], "logprobs": [True, None],
               "response_format": [{"type": "text"}, {"type": "json_object"}, "json"], "ignore_eos": [True, "no"],
               "stream_options": [{"include_usage": True}, "x"], "tools": [[{"type": "function"}], None]}
    for key, values in options.items():
        if rng.random() < 0.2:
            body[key] = values[int(rng.integers(len(values)))]
    if rng.random() < 0.05:
        body["unknown_" + str(rng.integers(9))] = anything()
    return path, body


@dataclass
class FuzzReport:
    """What the fuzz loop sent and got (JSON-able through :meth:`summary`)."""

    sent: Counter = field(default_factory=Counter)  # model -> requests
    kinds: Counter = field(default_factory=Counter)  # "model | category" -> count
    examples: dict = field(default_factory=dict)  # "model | category" -> the first error of that kind
    hung: list = field(default_factory=list)
    tracebacks: list = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        return {"requests": sum(self.sent.values()), "by_model": dict(self.sent),
                "accepted": sum(v for k, v in self.kinds.items() if k.endswith("| answered")),
                "errors": sum(v for k, v in self.kinds.items() if not k.endswith("| answered")),
                "by_kind": dict(sorted(self.kinds.items())), "examples": dict(sorted(self.examples.items())),
                "hung": self.hung, "tracebacks": self.tracebacks,
                "seconds": round(self.seconds, 1)}


def fuzz(server: Server, seconds: float | None = None, seed: int = 0, vocab: int = 49152,
         requests: int | None = None) -> FuzzReport:
    """Random requests: ``requests`` of them (the tests: the same seeded requests on every machine, however busy),
    else for ``seconds`` (the benchmark); round robin over the models (random tensors) and the OpenAI frontend
    (random bodies, when ``server.frontend_url``); each waits at most TIMEOUT_S for a response."""
    if (seconds is None) == (requests is None):
        raise ValueError("fuzz: give seconds or requests, one of them")
    rng = np.random.default_rng(seed)
    specs = model_inputs(server)
    report = FuzzReport()
    targets = list(MODELS) + (["openai"] if server.frontend_url else [])
    t0 = time.perf_counter()
    i = 0
    def more() -> bool:
        return i < requests if requests is not None else time.perf_counter() - t0 < seconds

    while more():
        target = targets[i % len(targets)]
        i += 1
        report.sent[target] += 1
        if target == "openai":
            path, body = random_body(rng)
            status, raw = post(server.frontend_url, path, body)
            try:
                err = json.loads(raw)["error"] if status != 200 else {}
                param, message = err.get("param"), str(err.get("message"))
            except (ValueError, KeyError, TypeError, AttributeError):
                param, message = "(not an OpenAI error body)", raw[:200].decode(errors="replace")
            key = f"openai | {status}" + (f" {param}" if param else "") if status != 200 else "openai | answered"
            report.kinds[key] += 1
            if status != 200:
                report.examples.setdefault(key, message[:200])
            if status == 0:
                report.hung.append({"target": target, "request": repr(body)[:300]})
            if status >= 500 or param == "(not an OpenAI error body)":
                report.tracebacks.append({"target": target, "status": status, "request": repr(body)[:300],
                                          "answer": raw[:300].decode(errors="replace")})
            continue
        inputs = random_request(rng, target, specs[target], vocab)
        reply = send(server, target, inputs, "stream" if target in DECOUPLED else
                     str(rng.choice(["http", "grpc"])))
        if reply.hung:
            report.hung.append({"target": target, "inputs": _describe(inputs)})
            report.kinds[f"{target} | hung"] += 1
        elif reply.error is None:
            report.kinds[f"{target} | answered"] += 1
        else:
            key = f"{target} | {category(reply.error)}"
            report.kinds[key] += 1
            report.examples.setdefault(key, reply.error[:200])
            if is_traceback(reply.error):
                report.tracebacks.append({"target": target, "inputs": _describe(inputs), "error": reply.error[:400]})
    report.seconds = time.perf_counter() - t0
    return report


def _describe(inputs: dict) -> dict:
    return {n: f"{d}{list(a.shape)} {np.array2string(a.reshape(-1)[:4], threshold=4)[:80]}"
            for n, (a, d) in inputs.items()}
