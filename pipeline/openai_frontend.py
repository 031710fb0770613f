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

Sampling follows OpenAI: temperature and top_p default to 1 (sampling); ``temperature: 0`` is greedy. ``logprobs``
(chat: with ``top_logprobs``; completions: k, and ``echo``) as OpenAI answers them where the runtime returns them
(pipeline.openai_logprobs). Structured output (``response_format``, vLLM's ``guided_*``) and ``tools`` become the
models' guided-decoding inputs (pipeline.openai_guided, pipeline.openai_tools). Several prompts in one
non-streamed completion request are answered as OpenAI's legacy endpoint does. What is refused, with a 400 naming
the field, is listed in pipeline.openai_requests.

Security (pipeline.openai_security, pipeline.openai_limits): with an API key (``--api-key`` or the environment
variable ``TRTPIPE_API_KEY``) every route but ``/health`` and ``/metrics`` needs ``Authorization: Bearer <key>``
(401 otherwise); on any address but loopback the key is required, and the frontend refuses to start without one
before it listens. Request bodies are bounded (``--max-body-bytes``, 413) and a prompt longer in characters than
max_input_len tokens can be is refused before it is tokenized.

This module is the command (:func:`main`, :func:`build_parser`) and hands on the names of its parts, one job
each: :mod:`pipeline.openai_requests` (an OpenAI body -> prompt, max_tokens, stop, Triton inputs; the bodies,
the limits, :class:`APIError`), :mod:`pipeline.openai_triton` (one request's gRPC stream to the BLS model),
:mod:`pipeline.openai_serving` (the answers and their server-sent events, ``/metrics``' counters, each request
counted in flight in one place), :mod:`pipeline.openai_router` (the routes: :func:`create_app`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional

from builders.spec import default_port
from pipeline.openai_requests import (COMPLETIONS_DEFAULT_MAX_TOKENS, APIError, ChatBody, CompletionBody,
                                      FrontendConfig, prepare)
from model_repo.launch import FRONTEND_API_KEY_ENV
from pipeline.openai_router import create_app
from pipeline.openai_security import BindRefused, check_bind, resolve_api_key
from pipeline.openai_serving import Events, Metrics, Serving
from pipeline.openai_triton import Delta, Triton, triton_error

__all__ = ["APIError", "COMPLETIONS_DEFAULT_MAX_TOKENS", "ChatBody", "CompletionBody", "Delta", "Events",
           "FrontendConfig", "Metrics", "Serving", "Triton", "build_parser", "create_app", "main", "prepare",
           "triton_error"]

log = logging.getLogger("trtpipe.openai")


def build_parser() -> argparse.ArgumentParser:
    """The command line ``model_repo.launch.frontend_argv`` writes (tests/model_repo/test_deploy.py parses one back)."""
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
    p.add_argument("--context-logits", action="store_true", help="the engine returns context logits (the build "
                   "file's limits.gather_context_logits): prompt log probabilities on the trtllm runtime")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1; any other than loopback "
                   "needs an API key)")
    p.add_argument("--api-key", default=None, help=f"the key clients send as `Authorization: Bearer <key>` (default "
                   f"${FRONTEND_API_KEY_ENV}; prefer the variable: a command line shows in `ps`)")
    p.add_argument("--max-body-bytes", type=int, default=None, help="largest request body (default 1 MiB + 64 bytes "
                   "per token of --max-input-len; 413 above it)")
    p.add_argument("--port", type=int, default=default_port("openai_port"),
                   help="listen port (default serving.openai_port's default)")
    p.add_argument("--max-n", type=int, default=8, help="most choices per request (default 8)")
    p.add_argument("--triton-model", default="tensorrt_llm_bls", help="the Triton model requests go to (default "
                   "tensorrt_llm_bls: it forwards cancellation; `ensemble` does not)")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=TASK_ID", type=_lora_option,
                   help="a LoRA adapter served beside the base model (repeatable): clients select it by sending NAME "
                        "as `model`, and its requests carry lora_task_id TASK_ID (the build's plan.json "
                        "lora.adapters)")
    p.add_argument("--lora-path", action="append", default=[], metavar="NAME=PATH", type=_lora_path_option,
                   help="the PEFT folder of adapter NAME (repeatable): /v1/models' root, and the only lora_path a "
                        "request's lora_request may name")
    p.add_argument("--triton-pid", type=int, default=None, help="exit once this process (the local tritonserver "
                   "`trtpipe serve` started) has exited; without it (Triton elsewhere) /health answers 503 instead")
    return p


def _pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"{text!r}: {what} expected")
    return name, value


def _lora_option(text: str) -> tuple[str, int]:
    """``--lora NAME=TASK_ID`` -> (name, task id >= 1)."""
    name, value = _pair(text, "NAME=TASK_ID")
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: TASK_ID must be an integer >= 1 (0 is the base model)")
    return name, int(value)


def _lora_path_option(text: str) -> tuple[str, str]:
    """``--lora-path NAME=PATH`` -> (name, path)."""
    return _pair(text, "NAME=PATH")


def adapters_of(args: argparse.Namespace) -> tuple[dict[str, int], dict[str, str]]:
    """The ``--lora`` and ``--lora-path`` options as FrontendConfig's ``adapters`` and ``adapter_paths``; ValueError
    for a name given twice, a task id given to two names, a name that is the base model's, or a path without its
    adapter."""
    adapters: dict[str, int] = {}
    for name, task in args.lora:
        if name in adapters:
            raise ValueError(f"--lora {name}=...: adapter {name!r} given twice")
        if name == args.model:
            raise ValueError(f"--lora {name}=...: {name!r} is the base model's id (--model)")
        if task in adapters.values():
            raise ValueError(f"--lora {name}={task}: task id {task} is already adapter "
                             f"{next(n for n, t in adapters.items() if t == task)!r}'s")
        adapters[name] = task
    paths = dict(args.lora_path)
    stray = sorted(set(paths) - set(adapters))
    if stray:
        raise ValueError(f"--lora-path {stray[0]}=...: no --lora {stray[0]}=TASK_ID")
    return adapters, paths


EXIT_REFUSED = 2
"""The exit status when the frontend refuses to start (non-loopback address without an API key)."""


def main(argv: Optional[list[str]] = None) -> int:
    """Parse ``argv``, check the listen address against the key (before the tokenizer loads or any socket is
    opened: exit :data:`EXIT_REFUSED` with the reason on stderr), then serve until stopped."""
    args = build_parser().parse_args(argv)
    key = resolve_api_key(args.api_key)
    try:
        check_bind(args.host, key)
    except BindRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if args.max_body_bytes is not None and args.max_body_bytes < 1:
        print(f"error: --max-body-bytes {args.max_body_bytes}: must be at least 1 (bytes)", file=sys.stderr)
        return EXIT_REFUSED
    try:
        adapters, adapter_paths = adapters_of(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = FrontendConfig(args.grpc_url, args.model, args.tokenizer, args.max_input_len, args.max_seq_len,
                         args.add_special_tokens, triton_model=args.triton_model, max_n=args.max_n,
                         trust_remote_code=args.trust_remote_code, context_logits=args.context_logits,
                         max_body_bytes=args.max_body_bytes, adapters=adapters, adapter_paths=adapter_paths)
    if adapters:
        log.info("LoRA adapters (model -> lora_task_id): %s", ", ".join(f"{n} -> {t}" for n, t in adapters.items()))
    log.info("API key: %s", "required on every route but /health and /metrics" if key else
             "none (listening on loopback only)")
    if args.triton_pid:  # exit once the local tritonserver has (SIGTERM first: uvicorn closes its connections)
        from trtpipe_runtime.lifeline import watch_pid

        watch_pid(args.triton_pid, "tritonserver", grace_s=10.0)
    uvicorn.run(create_app(cfg, api_key=key), host=args.host, port=args.port, log_level="info", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
