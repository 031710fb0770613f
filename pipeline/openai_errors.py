"""The OpenAI frontend's error: one class every frontend module raises (pipeline.openai_requests re-exports it)."""

from __future__ import annotations

from typing import Optional


class APIError(Exception):
    """An OpenAI-style error: HTTP ``status`` and the body's message, type, param and code (OpenAI's
    ``{"error": {"message", "type", "param", "code"}}``)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
