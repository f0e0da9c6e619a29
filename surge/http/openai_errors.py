"""The OpenAI error shape `{"error": {"message", "type", "param", "code"}}`, shared by the server
(surge/server/errors.py) and the gateway (surge/gateway/errors.py): the exception base both
raise, its rendering (a JSON response, or a stream's last `data:` event), the FastAPI handlers
that route every failure through it, and the pydantic model that declares it in OpenAPI.

Clients (the `openai` SDK included) parse this object for every non-2xx status, so 404s, 405s,
validation failures and crashes all use it."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


def retry_after_header(seconds: float) -> str:
    """Retry-After must be a whole number of seconds; round up, at least 1, so a client never
    comes back too early."""
    if not math.isfinite(seconds) or seconds <= 1.0:
        return "1"
    return str(math.ceil(seconds))


class OpenAIError(Exception):
    """Base of every error answered in the OpenAI shape; subclasses fix status, type and code."""

    status_code: int = 500
    type: str = "server_error"
    default_code: str | int | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        retry_after_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers: dict[str, str] = dict(headers or {})
        if retry_after_s is not None:
            self.headers = {"Retry-After": retry_after_header(retry_after_s), **self.headers}

    def body(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers or None)

    def sse_event(self) -> str:
        """The error as a stream's last event, once the headers (a 200) are sent."""
        return f"data: {json.dumps(self.body())}\n\n"


def status_error(
    status_code: int,
    message: str,
    *,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> OpenAIError:
    """An error for a bare HTTP status (a Starlette HTTPException, a crash)."""
    err = OpenAIError(message, code=code, headers=headers)
    err.status_code = status_code
    err.type = "server_error" if status_code >= 500 else "invalid_request_error"
    return err


# --- OpenAPI: the error object, and the statuses a route declares with it ---


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """What every non-2xx answer carries (and a stream's last event on a late failure)."""

    error: ErrorDetail = Field(description="OpenAI's error object")


_STATUS_TEXT = {
    400: "Invalid request: a bad field, malformed JSON, or a method not allowed",
    401: "Missing or invalid API key (with --api-key)",
    404: "No such model, adapter, response or path",
    413: "Request body over the size limit",
    429: "Rate limited or queue full (see Retry-After)",
    500: "Internal error",
    502: "Bad gateway: no upstream answered",
    503: "Not ready, draining, overloaded, or the engine is down (see Retry-After)",
    504: "Request timed out",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses=` declaring `statuses` with the OpenAI error body."""
    return {s: {"model": ErrorResponse, "description": _STATUS_TEXT[s]} for s in statuses}


# --- FastAPI handlers ---


async def _on_openai_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OpenAIError)
    return exc.response()


def install_openai_error_handlers(
    app: FastAPI,
    *,
    from_http_exception: Callable[[Request, StarletteHTTPException], OpenAIError],
    internal_error: Callable[[], OpenAIError],
) -> None:
    """Route every failure on `app` through the OpenAI error shape: our own errors as they are,
    Starlette's (404, 405) through `from_http_exception`, and any crash as `internal_error()`,
    whose message tells the client nothing of the internals."""

    async def on_http_exception(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return from_http_exception(request, exc).response()

    async def on_unhandled(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises after this response so the server still logs the traceback.
        logger.error("unhandled error on %s %s: %r", request.method, request.url.path, exc)
        return internal_error().response()

    app.add_exception_handler(OpenAIError, _on_openai_error)
    app.add_exception_handler(StarletteHTTPException, on_http_exception)
    app.add_exception_handler(Exception, on_unhandled)
