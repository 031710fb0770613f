"""OpenAI request -> Triton request, for the OpenAI-compatible frontend (pipeline.openai_frontend).

One job: read an OpenAI ``/v1/chat/completions`` or ``/v1/completions`` body (the fields this frontend reads;
unknown fields are ignored, as OpenAI's are), check it against what is served (:class:`FrontendConfig`), and turn
it into a prompt, ``max_tokens``, stop words and the BLS model's extra inputs (:func:`prepare`). Every refusal is
an :class:`APIError` (OpenAI's ``{"error": {"message", "type", "param", "code"}}`` body and an HTTP status).

Sampling follows OpenAI: temperature and top_p default to 1 (sampling); ``temperature: 0`` is greedy. Log
probabilities as OpenAI answers them (pipeline.openai_logprobs builds the shapes): chat's ``logprobs: true`` with
``top_logprobs`` 0-20 (only with ``logprobs: true``), completions' ``logprobs`` k 0-20 (vLLM's limit: OpenAI's
legacy endpoint allows 5; the runtime's limit is 20) and ``echo`` (the prompt leads the text and, with
``logprobs``, its tokens lead the log probabilities, the first with null); ``max_tokens: 0`` with ``echo`` scores
the prompt alone (the runtime generates one token, which is dropped and not counted). They need a runtime that
returns them: the portable ``pytorch`` runtime (its Triton model declares num_top_logprobs), or TensorRT-LLM's C++
backend (runtime ``trtllm``) with the sampled tokens' log probabilities only and, from an engine built with
``limits.gather_context_logits``, the prompt's (pipeline.openai_context_logits); elsewhere a 400 names the parameter. Structured output (``response_format``, vLLM's ``guided_*``: pipeline.openai_guided) and tools
(pipeline.openai_tools) become the Triton models' guided-decoding inputs. Not supported, answered with 400:
``logit_bias``, the deprecated ``functions`` / ``function_call``, ``suffix``, and several prompts in one
streamed completion request. A completion prompt may be token ids (decoded here; the Triton models take text);
several prompts in one non-streamed request are answered as OpenAI's legacy endpoint answers them (choice
``index`` = prompt x ``n`` + choice, usage summed), at most :data:`MAX_PROMPTS`.

LoRA (:func:`lora_task_id`): ``model`` names the base model (the build name) or one of the build's adapters (vLLM's
convention), and trtllm-serve's ``lora_request`` may name the adapter instead; an adapter is sent as the
``lora_task_id`` input, the base model without it. Another model is a 404 ``model_not_found`` naming the served ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Optional, Union

from jinja2.exceptions import TemplateError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from pipeline.openai_errors import APIError  # the other frontend modules import it from here too
from pipeline.openai_guided import Guide, checked, guide_of
from pipeline.openai_tools import template_messages, validate_tool_request, validate_tools

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's documented default of ``max_tokens`` for ``/v1/completions``; chat defaults to what the context holds."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives per token: chat's ``top_logprobs`` (OpenAI's limit) and completions' ``logprobs`` (vLLM's;
OpenAI's legacy completions allow 5); the runtime's num_top_logprobs limit (trtpipe_runtime.decoding)."""
MAX_PROMPTS = 256
"""The most prompts in one ``/v1/completions`` request (each is one request to Triton, sent at once; vLLM sets no
limit, lm-evaluation-harness sends ``--batch_size`` of them)."""
LORA_INPUT = "lora_task_id"
"""The Triton input that selects a LoRA adapter (UINT64 [1], upstream TensorRT-LLM backend's name; absent or 0: the
base model); every runtime's ensemble, tensorrt_llm_bls and tensorrt_llm models take it."""
LOG_PROB_INPUT = "num_top_logprobs"
"""The Triton input a model must declare for this frontend to ask it for log probabilities (the log-prob tensors
of model_repo.generate: the portable runtime's repository has them)."""


@dataclass
class FrontendConfig:
    """What the frontend serves and where it sends requests."""

    grpc_url: str
    """Triton's gRPC ``host:port``."""
    model: str
    """The served model id (the build name): requests naming another get 404."""
    tokenizer_dir: Path
    max_input_len: int
    max_seq_len: int
    add_special_tokens: bool = False
    """As the repository's preprocessing model tokenizes (its ``add_special_tokens`` parameter)."""
    triton_model: str = "tensorrt_llm_bls"
    """The Triton model requests go to: the BLS model, not the ensemble, because Triton hands an ensemble's
    cancellation only to its next step, never to the tensorrt_llm step already streaming (docs/deploy.md,
    "Cancelling"); BLS forwards it, so a client that goes away frees its KV blocks at once."""
    max_n: int = 8
    """Most choices per request (``n``; the runtime's num_return_sequences)."""
    request_timeout_s: float = 600.0
    trust_remote_code: bool = False
    """Whether the tokenizer's own code may run (the repository's preprocessing ``trust_remote_code`` parameter:
    the build file's model.trust_remote_code)."""
    context_logits: bool = False
    """The served engine returns context logits (the build file's limits.gather_context_logits): on a runtime
    without this project's log-prob tensors, prompt log probabilities come from them
    (pipeline.openai_context_logits)."""
    max_body_bytes: Optional[int] = None
    """The largest request body read (bytes; 413 above it); None: pipeline.openai_limits.default_max_body_bytes of
    max_input_len."""
    max_prompt_chars: Optional[int] = None
    """A prompt longer than this many characters is refused before it is tokenized (it has more than max_input_len
    tokens: pipeline.openai_limits.prompt_char_limit, which create_app sets from the tokenizer); None: no such
    check."""
    adapters: dict[str, int] = field(default_factory=dict)
    """LoRA adapters served beside the base model: name (what a client sends as ``model``, vLLM's convention) ->
    its ``lora_task_id`` (the build's plan.json ``lora.adapters``: 1, 2, ...); empty: the base model only."""
    adapter_paths: dict[str, str] = field(default_factory=dict)
    """Adapter name -> its PEFT folder as the build read it (``/v1/models``' ``root``; a ``lora_request`` naming
    another ``lora_path`` is refused: adapters are fixed at build time); may leave adapters out."""

    @property
    def served(self) -> list[str]:
        """The model ids clients may name: the base (the build name), then each adapter in task-id order."""
        return [self.model, *sorted(self.adapters, key=self.adapters.get)]

    @property
    def body_limit(self) -> int:
        """:attr:`max_body_bytes`, or its default for max_input_len."""
        from pipeline.openai_limits import default_max_body_bytes

        return self.max_body_bytes or default_max_body_bytes(self.max_input_len)


# ---- request bodies (the OpenAI fields this frontend reads; unknown fields are ignored, as OpenAI's are) ----


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: Optional[int] = Field(None, ge=1)
    stream: StrictBool = False  # true or false: "no" or 0 would otherwise read as a boolean
    stream_options: Optional[dict] = None
    stop: Optional[Union[str, list[str]]] = None
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, ge=0.0, le=1.0)  # 0: greedy (TensorRT-LLM's rule)
    top_k: Optional[int] = Field(None, ge=0)
    """vLLM's extension: sample from the k most likely tokens (0: no limit)."""
    seed: Optional[int] = Field(None, ge=-2**63, le=2**64 - 1)  # OpenAI's int64; the ensemble's seed is UINT64
    logit_bias: Optional[dict[str, float]] = None
    n: int = Field(1, ge=1)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    ignore_eos: bool = False
    """vLLM's extension (``vllm bench serve --ignore-eos``, aiperf): generate max_tokens whatever the model says."""
    min_tokens: Optional[int] = Field(None, ge=0)
    """vLLM's extension: generate at least this many tokens."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[dict]]] = None


class ChatBody(_Body):
    messages: list[_Message] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[StrictBool] = None
    top_logprobs: Optional[StrictInt] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class CompletionBody(_Body):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    """Text, or token ids (OpenAI's spec allows both; lm-evaluation-harness sends ids by default)."""
    max_tokens: Optional[int] = Field(None, ge=0)  # 0: only with echo (scoring the prompt)
    echo: StrictBool = False
    logprobs: Optional[StrictInt] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    suffix: Optional[str] = None

    def prompts(self) -> list:
        """The prompts as sent, one item each: a string or a list of token ids (``[]`` is one empty prompt)."""
        p = self.prompt
        return list(p) if isinstance(p, list) and p and not isinstance(p[0], int) else [p]


# ---- body -> prompt --------------------------------------------------------------------------------------------


async def read_json(request, limit: Optional[int] = None) -> dict:
    """The request's body as a JSON object (a Starlette ``Request``), read up to ``limit`` bytes (None: no limit;
    pipeline.openai_limits.read_body: APIError 413 past it); APIError 400 when it is not JSON or not an object."""
    from pipeline.openai_limits import read_body

    raw = await read_body(request, limit) if limit is not None else await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    return body


def chat_request(tok, raw: dict) -> tuple[ChatBody, str]:
    """A chat body and its prompt: the messages through the model's chat template (``developer`` read as
    ``system``; with no template, the contents one a line). APIError 400 on a body that does not validate or a
    content part that is not text."""
    try:
        body = ChatBody.model_validate(raw)
        messages = template_messages([_template_message(m) for m in body.messages])
        extra = body.model_extra or {}
        tools = validate_tools(extra["tools"]) if extra.get("tools") else None  # shown whatever tool_choice says
        prompt = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False) \
            if tok.chat_template else "\n".join(m["content"] for m in messages)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    except TemplateError as exc:  # the template's own raise_exception: a conversation it does not take
        raise APIError(400, f"messages: the model's chat template refuses this conversation: {exc}",
                       param="messages") from None
    return body, prompt


def _template_message(m: _Message) -> dict:
    """A chat message as the chat template reads it: ``developer`` as ``system``, the content as text, and an
    assistant's ``tool_calls`` / a tool message's ``tool_call_id`` and ``name`` kept (tool round trips)."""
    out = {"role": m.role if m.role != "developer" else "system", "content": _content_text(m.content)}
    for key in ("tool_calls", "tool_call_id", "name"):
        value = (m.model_extra or {}).get(key)
        if value is not None:
            out[key] = value
    return out


def completion_request(tok, raw: dict, add_special_tokens: bool = False,
                       max_input_len: Optional[int] = None) -> tuple[CompletionBody, list[str]]:
    """A completion body and its prompts: one string or list of token ids, or a list of several (OpenAI's spec
    allows ``str``, ``[str]``, ``[int]`` and ``[[int]]``); token ids are decoded with the model's tokenizer ``tok``
    (with ``add_special_tokens``, as the preprocessing model tokenizes, a leading BOS id is left for it to add
    where the tokenizer adds one).
    APIError 400 on a body that does not validate, more than :data:`MAX_PROMPTS` prompts, several prompts with
    ``stream: true``, ids outside the vocabulary or that the tokenizer would not give back from their text (the
    Triton models take text, so such ids cannot be served as sent), ``max_tokens: 0`` without ``echo``, or
    ``suffix``; 400 ``context_length_exceeded`` for a token-id prompt of more than ``max_input_len`` ids, before
    it is decoded (its text tokenizes back to the same ids, so it would be as long)."""
    try:
        body = CompletionBody.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    sent = body.prompts()
    if len(sent) > MAX_PROMPTS:
        raise APIError(400, f"prompt: {len(sent)} prompts in one request: at most {MAX_PROMPTS}: split them across "
                            "requests", param="prompt")
    if len(sent) > 1 and body.stream:
        raise APIError(400, f"prompt: {len(sent)} prompts with stream: true: this server streams one prompt per "
                            "request: send stream: false, or one request per prompt", param="prompt")
    if max_input_len is not None:
        longest = max((len(p) for p in sent if isinstance(p, list)), default=0)
        if longest > max_input_len:
            raise APIError(400, f"prompt: {longest} token ids; this model takes at most {max_input_len} "
                                "(max_input_len)", param="prompt", code="context_length_exceeded")
    bos = getattr(tok, "bos_token_id", None)
    adds_bos = add_special_tokens and bos is not None and tok.encode("a", add_special_tokens=True)[:1] == [bos]
    prompts = [p if isinstance(p, str) else _ids_prompt(tok, p[1:] if adds_bos and p[:1] == [bos] else p)
               for p in sent]
    if body.suffix:
        raise APIError(400, "suffix is not supported by this server", param="suffix")
    if body.max_tokens == 0 and not body.echo:
        raise APIError(400, "max_tokens: 0 generates nothing: send at least 1, or echo: true to score the prompt "
                            "alone", param="max_tokens")
    return body, prompts


def _ids_prompt(tok, ids: list[int]) -> str:
    """A token-id prompt as the text the preprocessing model will tokenize back to the same ids."""
    if not ids:
        raise APIError(400, "prompt: the prompt is empty: send some text or token ids", param="prompt")
    bad = [i for i in ids if not 0 <= i < len(tok)]
    if bad:
        raise APIError(400, f"prompt: token id {bad[0]} is outside this model's vocabulary of {len(tok)} ids",
                       param="prompt")
    text = tok.decode(ids)
    again = tok.encode(text, add_special_tokens=False)
    if again != ids:
        at = next((k for k, (a, b) in enumerate(zip(again, ids)) if a != b), min(len(again), len(ids)))
        raise APIError(400, f"prompt: the token ids do not come back from their text (at position {at}: "
                            f"{ids[at] if at < len(ids) else 'end'} becomes "
                            f"{again[at] if at < len(again) else 'end'}); this server tokenizes text itself: send "
                            "the prompt as text", param="prompt")
    return text


def _content_text(content) -> str:
    """A message's content as text: a string, or the text parts of a content list (other parts refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise APIError(400, f"content part of type {part.get('type')!r}: this model takes text only",
                           param="messages")
        if not isinstance(part.get("text", ""), str):
            raise APIError(400, f"messages: the text of a content part is {type(part['text']).__name__}, not a "
                                "string: send the text as a string", param="messages")
        parts.append(part.get("text", ""))
    return "".join(parts)


def _validation_error(exc: ValidationError) -> APIError:
    """A pydantic error -> APIError 400 naming the first failing field (``param``: its dotted path)."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ())) or None
    return APIError(400, f"{param}: {first.get('msg')}" + (f" (got {first['input']!r})" if "input" in first and
                                                             not isinstance(first["input"], dict) else ""),
                    param=param)


# ---- body -> Triton request ------------------------------------------------------------------------------------


class Prepared(NamedTuple):
    """What one request asks of Triton."""

    n_prompt: int
    """The prompt's tokens, counted as the preprocessing model counts them."""
    max_tokens: int
    """Most tokens to generate per choice (asked, or what the context holds; completions: at most 16)."""
    stop: list[str]
    extra: dict
    """The BLS model's other inputs (temperature, top_p, top_k, seed, penalties, num_return_sequences, end_id,
    min_tokens), only those the request sets."""
    copies: int = 1
    """Choices answered by copying the one generated (greedy with ``n`` > 1: the n choices would be equal)."""
    logprobs: Optional[int] = None
    """Log probabilities asked for: None (none), else the alternatives per token (chat's top_logprobs,
    completions' logprobs)."""
    echo: bool = False
    """Completions' ``echo``: the prompt leads the answer (and, with ``logprobs``, its tokens the log probs)."""
    prompt_ids: tuple = ()
    """The prompt's token ids as the preprocessing model tokenizes it (the tokens prompt log probabilities score)."""
    echo_from: int = 0
    """Prompt tokens left out of the echoed log probabilities: 1 when the prompt came as token ids and the
    tokenizer adds a BOS the client did not send (the client's tokens are echoed, as it sent them)."""
    generate: bool = True
    """False for ``max_tokens: 0`` with ``echo``: one token is generated (the runtime's least), then dropped."""
    guide: Any = None
    """The structured-output constraint (pipeline.openai_guided.Guide), None for free text."""
    tools: Any = None
    """What the request's tools ask for (pipeline.openai_tools.ToolPlan), None without tools or with
    ``tool_choice: "none"``."""
    outputs: tuple = ()
    """The log-probability tensors to ask the BLS model for, chosen by the frontend from what the served model
    declares (pipeline.openai_serving); empty without log probabilities."""


def prepare(cfg: FrontendConfig, tok: Any, body: _Body, prompt: str, chat: bool, sent: Any = None) -> Prepared:
    """Check the body against the model and the limits; return prompt tokens, max_tokens, stop, inputs.

    ``prompt``: the text to send (chat: the rendered conversation; completions: one of completion_request's
    prompts); ``sent``: that completion prompt as the client sent it (text or token ids; None: ``prompt``).

    ``tok``: the model's tokenizer (counts the prompt; ``len(tok)`` is the id ``ignore_eos`` stops at). APIError
    404 for another model, 400 for what is not supported or does not fit (``code`` ``context_length_exceeded``
    when the prompt, or prompt and max_tokens, exceed max_input_len / max_seq_len)."""
    extra_fields = body.model_extra or {}
    task_id = lora_task_id(cfg, body.model, extra_fields.get("lora_request"))
    if body.logit_bias:
        raise APIError(400, "logit_bias is not supported by this server (the Triton models bias words, not token "
                            "ids: send embedding_bias_words to Triton directly)", param="logit_bias")
    for key in ("functions", "function_call"):  # OpenAI's deprecated forms of tools / tool_choice
        if extra_fields.get(key):
            raise APIError(400, f"{key}: the deprecated function-calling fields are not supported: send "
                                f"{'tools' if key == 'functions' else 'tool_choice'} instead", param=key)
    guide = guide_of(extra_fields)
    plan = None
    if extra_fields.get("tools") or extra_fields.get("tool_choice") not in (None, "none", "auto"):
        if not chat:
            raise APIError(400, "tools: tool calling is a chat feature: send tools to /v1/chat/completions",
                           param="tools")
        plan = validate_tool_request(extra_fields.get("tools"), extra_fields.get("tool_choice", "auto"),
                                     getattr(tok, "chat_template", None))
        if plan.tool_choice == "none":
            plan = None
        elif plan.schema is not None:
            if guide is not None:
                raise APIError(400, f"{guide.field}: a forced tool call (tool_choice {plan.tool_choice!r}) is "
                                    "already constrained by the tools' schema: send one of the two",
                               param=guide.field)
            guide = checked(Guide("json_schema", json.dumps(plan.schema, ensure_ascii=False), "tools"))
    if body.n > cfg.max_n:
        raise APIError(400, f"n = {body.n}: at most {cfg.max_n}", param="n")
    field = "messages" if chat else "prompt"
    _check_text(prompt, field)
    if not prompt.strip():
        raise APIError(400, f"{field}: the prompt is empty: send some text", param=field)
    if cfg.max_prompt_chars is not None and len(prompt) > cfg.max_prompt_chars:  # more tokens than max_input_len
        raise APIError(400, f"{field}: the prompt is {len(prompt)} characters, more than {cfg.max_input_len} tokens "
                            f"of this model's tokenizer can hold ({cfg.max_prompt_chars}); this model takes at most "
                            f"{cfg.max_input_len} tokens (max_input_len)", param=field, code="context_length_exceeded")
    prompt_ids = tok.encode(prompt, add_special_tokens=cfg.add_special_tokens)
    n_prompt = len(prompt_ids)
    if n_prompt > cfg.max_input_len:
        raise APIError(400, f"{field}: the prompt is {n_prompt} tokens; this model takes at most "
                            f"{cfg.max_input_len} (max_input_len)", param=field, code="context_length_exceeded")
    room = cfg.max_seq_len - n_prompt
    asked = (getattr(body, "max_completion_tokens", None) or body.max_tokens) if chat else body.max_tokens
    if asked is not None and asked > room:
        raise APIError(400, f"max_tokens {asked} + prompt {n_prompt} tokens exceed the context of "
                            f"{cfg.max_seq_len} (max_seq_len)", param="max_tokens", code="context_length_exceeded")
    generate = asked != 0  # 0: completions' echo scoring the prompt (completion_request allows it only there)
    max_tokens = asked or (1 if not generate else room if chat else min(COMPLETIONS_DEFAULT_MAX_TOKENS, room))
    if body.min_tokens and body.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens = {body.min_tokens} exceeds max_tokens = {max_tokens}: lower min_tokens "
                            "or raise max_tokens", param="min_tokens")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    for word in stop:
        _check_text(word, "stop")
    extra: dict = {LORA_INPUT: task_id} if task_id else {}
    temperature = 1.0 if body.temperature is None else body.temperature
    greedy = temperature == 0.0 or body.top_p == 0.0 or body.top_k == 1
    if not greedy:  # greedy: nothing sent, the runtimes' default is greedy (top_k and top_p unset)
        extra.update(temperature=temperature, top_p=1.0 if body.top_p is None else body.top_p)
        if body.top_k:
            extra["top_k"] = body.top_k
    if body.seed is not None:
        extra["seed"] = body.seed % 2**64  # a negative int64 as the UINT64 of the same bits
    for key in ("presence_penalty", "frequency_penalty"):
        if getattr(body, key) is not None:
            extra[key] = getattr(body, key)
    if body.n > 1 and not greedy:  # greedy: one sequence, copied n times (they would be the same)
        extra["num_return_sequences"] = body.n
    if body.ignore_eos:
        extra["end_id"] = len(tok)  # an id past the vocabulary is never generated: runs to max_tokens
    if body.min_tokens:
        extra["min_tokens"] = body.min_tokens
    if guide is not None:
        extra.update(guide.inputs())
    logprobs = _logprobs_asked(body, chat)
    echo = bool(getattr(body, "echo", False))
    if logprobs is not None:
        extra["return_log_probs"] = True
        if logprobs:
            extra["num_top_logprobs"] = logprobs
        if echo:
            extra["return_prompt_log_probs"] = True
    return Prepared(n_prompt, max_tokens, stop, extra, body.n if body.n > 1 and greedy else 1, logprobs=logprobs,
                    echo=echo, prompt_ids=tuple(prompt_ids), echo_from=_echo_from(tok, prompt if sent is None else sent, prompt_ids) if echo else 0,
                    generate=generate, guide=guide, tools=plan)


def model_not_found(cfg: FrontendConfig, name: Any, param: str = "model") -> APIError:
    """404 ``model_not_found`` for a model id this server does not serve, naming the ids it does."""
    return APIError(404, f"model {name!r} not found: this server serves {', '.join(map(repr, cfg.served))}",
                    param=param, code="model_not_found")


def lora_task_id(cfg: FrontendConfig, model: str, lora_request: Any = None) -> Optional[int]:
    """The ``lora_task_id`` a request asks for: None for the base model, else the adapter's task id.

    ``model``: the body's ``model`` (vLLM's convention: the base model's id, or an adapter's name). ``lora_request``:
    trtllm-serve's extra body field (TensorRT-LLM's ``LoRARequest``: ``lora_name``, ``lora_int_id``, ``lora_path``),
    which must name a served adapter by ``lora_name`` or ``lora_int_id`` (both: the same one); its ``lora_path``, when
    sent, must be that adapter's folder, since adapters are fixed at build time. With it, ``model`` is the base
    model's id or the same adapter's name. APIError 404 ``model_not_found`` for a model or adapter not served (the
    message names the served ids), 400 for a malformed or conflicting ``lora_request``."""
    if model != cfg.model and model not in cfg.adapters:
        raise model_not_found(cfg, model)
    if lora_request is None:
        return cfg.adapters.get(model)
    if not isinstance(lora_request, dict):
        raise APIError(400, f"lora_request: an object of lora_name, lora_int_id and lora_path expected, got "
                            f"{type(lora_request).__name__}", param="lora_request")
    name, iid, path = (lora_request.get(k) for k in ("lora_name", "lora_int_id", "lora_path"))
    if name is None and iid is None:
        raise APIError(400, "lora_request: name the adapter by lora_name or lora_int_id (served: "
                            f"{_adapter_list(cfg)})", param="lora_request")
    if iid is not None and (isinstance(iid, bool) or not isinstance(iid, int)):
        raise APIError(400, f"lora_request.lora_int_id: an integer expected, got {iid!r}", param="lora_request")
    by_id = {t: n for n, t in cfg.adapters.items()}
    found = name if name is not None else by_id.get(iid)
    if found not in cfg.adapters:
        what = f"lora_name {name!r}" if name is not None else f"lora_int_id {iid}"
        raise APIError(404, f"lora_request: {what} is not an adapter this server serves (served: "
                            f"{_adapter_list(cfg)})", param="lora_request", code="model_not_found")
    if iid is not None and cfg.adapters[found] != iid:
        raise APIError(400, f"lora_request: lora_name {found!r} is lora_int_id {cfg.adapters[found]} here, not "
                            f"{iid}: send one of the two, or a matching pair", param="lora_request")
    served_path = cfg.adapter_paths.get(found)
    if path is not None and served_path is not None and str(path).rstrip("/") != served_path.rstrip("/"):
        raise APIError(400, f"lora_request.lora_path {path!r}: adapter {found!r} is served from {served_path!r}; "
                            "adapters are fixed at build time (the build file's lora.adapters): leave lora_path out, "
                            "or add the adapter to the build and rebuild", param="lora_request")
    if model != cfg.model and model != found:
        raise APIError(400, f"model {model!r} and lora_request's adapter {found!r} differ: send the base model "
                            f"{cfg.model!r} with lora_request, or the adapter's name as model alone",
                       param="lora_request")
    return cfg.adapters[found]


def _adapter_list(cfg: FrontendConfig) -> str:
    return ", ".join(f"{n!r} (lora_int_id {t})" for n, t in sorted(cfg.adapters.items(), key=lambda x: x[1])) \
        or "none: this build has no lora.adapters"


def _logprobs_asked(body: _Body, chat: bool) -> Optional[int]:
    """The alternatives per token a body asks for with its log probabilities (None: no log probabilities). Chat:
    ``top_logprobs`` (0 unless sent) with ``logprobs: true``; APIError 400 for top_logprobs without it (OpenAI's
    rule). Completions: ``logprobs`` itself."""
    if not chat:
        return body.logprobs
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, f"top_logprobs: {body.top_logprobs} needs logprobs: true (the alternatives come with the "
                            "log probabilities): send logprobs: true, or leave top_logprobs out", param="top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


def _echo_from(tok: Any, sent: Any, prompt_ids: list[int]) -> int:
    """1 when the prompt ``sent`` came as token ids without the BOS that tokenizing its text adds (the echo then
    starts at the client's first token, which the model scored after that BOS), else 0."""
    if isinstance(sent, list) and sent and isinstance(sent[0], int) and len(prompt_ids) == len(sent) + 1 \
            and prompt_ids[0] == getattr(tok, "bos_token_id", None) and list(prompt_ids[1:]) == list(sent):
        return 1
    return 0


def _check_text(text: str, field: str) -> None:
    """APIError 400 naming ``field`` when ``text`` holds a lone surrogate (a JSON "\\ud800" escape): not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(400, f"{field}: {text[exc.start]!r} at offset {exc.start} is not a Unicode character (a lone "
                            "surrogate escape): send valid text", param=field) from None
