"""The OpenAI frontend's API key: where it comes from, where it is required, how a request is checked.

One job: authentication, as vLLM's OpenAI server does it (``--api-key`` / ``VLLM_API_KEY``; its
``AuthenticationMiddleware``, vllm/entrypoints/openai/server_utils.py): a client sends ``Authorization: Bearer <key>``
(what the official ``openai`` client sends from its ``api_key``); every route needs it except the probes
``/health`` and ``/metrics`` (vLLM's ``PUBLIC_ENDPOINTS`` that this server has) and CORS preflights (``OPTIONS``).
The comparison is constant-time over SHA-256 digests (``hmac.compare_digest`` on equal-length values, so neither
the key's length nor a matching prefix shows in the time taken). A refusal is 401 with OpenAI's error body
(``invalid_request_error`` / ``invalid_api_key``, as api.openai.com answers a wrong key) and ``WWW-Authenticate:
Bearer`` (RFC 6750). The key is never logged, echoed or written anywhere.

Where it is required: a frontend that listens on anything but a loopback address must have a key, and refuses to
start without one before it binds (:func:`check_bind`); on 127.0.0.1 (``trtpipe serve``'s default) it is optional.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import socket
from typing import Mapping, Optional

from model_repo.launch import FRONTEND_API_KEY_ENV

PUBLIC_PATHS = ("/health", "/metrics")
"""Routes answered without a key: readiness probes and Prometheus scraping (they carry no model output)."""


def resolve_api_key(flag: Optional[str], environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The key: ``--api-key`` when given, else :data:`model_repo.launch.FRONTEND_API_KEY_ENV` from ``environ``;
    None when neither is set or both are empty."""
    key = flag if flag is not None else environ.get(FRONTEND_API_KEY_ENV)
    return key or None


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (127.0.0.0/8, ::1). ``0.0.0.0``, ``::`` and ``""``
    (every interface) are not; a host name counts only when each address it resolves to is loopback, and a name
    that does not resolve does not."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if not host:
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


class BindRefused(Exception):
    """The frontend was asked to listen beyond this host without an API key."""


def check_bind(host: str, key: Optional[str]) -> None:
    """Raise :class:`BindRefused` when ``host`` is not loopback (:func:`is_loopback`) and there is no ``key``: the
    message names the address, the rule and both ways to give a key."""
    if key is None and not is_loopback(host):
        raise BindRefused(
            f"--host {host}: the OpenAI frontend would answer every client that reaches this address, and no API key "
            f"is set; it requires one on any address but loopback: set {FRONTEND_API_KEY_ENV} in the environment "
            "(e.g. `export " + FRONTEND_API_KEY_ENV + "=$(openssl rand -hex 32)`; clients send it as "
            "`Authorization: Bearer <key>`, the openai client as api_key), or listen on 127.0.0.1. Nothing was "
            "started.")


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


UNAUTHORIZED = {"error": {"message": "Incorrect or missing API key: send it as `Authorization: Bearer <key>` (the "
                                     "openai client's api_key)", "type": "invalid_request_error", "param": None,
                          "code": "invalid_api_key"}}
"""The 401 body (OpenAI's error shape and code for a wrong key; the message names no part of what was sent)."""


class APIKeyAuth:
    """Pure ASGI middleware: requests to any path but :data:`PUBLIC_PATHS` need ``Authorization: Bearer <key>``
    (scheme case-insensitive, RFC 7235), else 401 :data:`UNAUTHORIZED` before the application sees the request
    (its body is never read). ``key``: the expected key (non-empty)."""

    def __init__(self, app, key: str):
        if not key:
            raise ValueError("APIKeyAuth: the key is empty: pass a non-empty key, or leave the middleware out")
        self.app, self._want = app, _digest(key.encode("utf-8"))

    def authorized(self, header: Optional[bytes]) -> bool:
        """Whether an ``Authorization`` header value (raw bytes; None: absent) carries the key."""
        if header is None:
            return False
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(_digest(token.strip()), self._want)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS" or _public(scope):
            await self.app(scope, receive, send)  # lifespan events, preflights, probes
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if self.authorized(header):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # none is served, but none passes unchecked either
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(UNAUTHORIZED).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})


def _public(scope) -> bool:
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    return path in PUBLIC_PATHS
