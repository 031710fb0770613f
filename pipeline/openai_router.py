"""The OpenAI frontend's routes: the FastAPI application, each route handed to :class:`Serving`.

One job: map HTTP to the serving class. ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``
(and ``/v1/models/{id}``), ``GET /health`` (200 when Triton and its model are ready, else 503), ``GET /metrics``
(Prometheus text), and FastAPI's own validation errors as OpenAI errors. With an API key, every route but
``/health`` and ``/metrics`` needs it (pipeline.openai_security.APIKeyAuth).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from pipeline.openai_limits import prompt_char_limit
from pipeline.openai_requests import FrontendConfig
from pipeline.openai_security import APIKeyAuth
from pipeline.openai_serving import CHAT, COMPLETIONS, Serving
from pipeline.openai_triton import Triton


def create_app(cfg: FrontendConfig, triton: Optional[Triton] = None, api_key: Optional[str] = None) -> FastAPI:
    """The FastAPI application for ``cfg`` (``triton``: the client to use; default one on ``cfg.grpc_url``;
    ``api_key``: the key every route but /health and /metrics requires, None: none).

    Loads the model's tokenizer from ``cfg.tokenizer_dir`` (local files only; its own code runs only with
    ``cfg.trust_remote_code``) and, unless ``cfg`` sets it, bounds prompts in characters from it
    (pipeline.openai_limits.prompt_char_limit). The application's :class:`Serving` is ``app.state.serving``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(cfg.tokenizer_dir), local_files_only=True,
                                        trust_remote_code=cfg.trust_remote_code)
    if cfg.max_prompt_chars is None:
        cfg = dataclasses.replace(cfg, max_prompt_chars=prompt_char_limit(tok, cfg.max_input_len))
        if cfg.max_prompt_chars is None:
            logging.getLogger("trtpipe.openai").info(
                "tokenizer %s: no character bound on prompts (pipeline.openai_limits): only the body limit of %d "
                "bytes applies before tokenizing", cfg.tokenizer_dir, cfg.body_limit)
    serving = Serving(cfg, tok, triton)
    app = FastAPI(title="trtpipe OpenAI-compatible frontend", docs_url=None, redoc_url=None)
    app.state.serving = serving
    if api_key is not None:
        app.add_middleware(APIKeyAuth, key=api_key)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return serving.invalid(request.url.path, exc)

    @app.get("/health")
    async def health():
        return await serving.health()

    @app.get("/metrics")
    async def prometheus():
        return serving.prometheus()

    @app.get("/v1/models")
    async def models():
        return serving.models()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        return serving.model(model_id)

    @app.post(CHAT)
    async def chat_completions(request: Request):
        return await serving.answer(request, chat=True)

    @app.post(COMPLETIONS)
    async def completions(request: Request):
        return await serving.answer(request, chat=False)

    return app
