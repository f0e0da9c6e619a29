"""The gateway's own errors, each rendered in the OpenAI shape
`{"error": {"message", "type", "param", "code"}}`, as a response or as a last SSE event.
(Errors an upstream returns pass through untouched.)"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from surge.gateway.retry import retry_after_header

log = logging.getLogger(__name__)

SSE_DONE = b"data: [DONE]\n\n"


class GatewayError(Exception):
    """Base of the errors the gateway answers itself; subclasses fix the status."""

    status_code = 502
    type = "upstream_error"
    default_code = "bad_gateway"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retry_after_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.headers = dict(headers or {})
        if retry_after_s is not None:
            self.headers["retry-after"] = retry_after_header(retry_after_s)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": None,
                          "code": self.code}}  # fmt: skip

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)

    def sse_event(self) -> bytes:
        return f"data: {json.dumps(self.body())}\n\n".encode()


class BadRequest(GatewayError):
    status_code = 400
    type = "invalid_request_error"
    default_code = "bad_request"


class NotFound(GatewayError):
    status_code = 404
    type = "not_found_error"
    default_code = "not_found"


class PayloadTooLarge(GatewayError):
    status_code = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class TooManyRequests(GatewayError):
    status_code = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class BadGateway(GatewayError):
    pass


class Unavailable(GatewayError):
    status_code = 503
    type = "service_unavailable_error"
    default_code = "service_unavailable"


class GatewayTimeout(GatewayError):
    status_code = 504
    type = "timeout_error"
    default_code = "timeout"


def _status_error(status_code: int, message: str, headers: Mapping[str, str]) -> GatewayError:
    err = GatewayError(message, code="http_error", headers=headers)
    err.status_code = status_code
    err.type = "server_error" if status_code >= 500 else "invalid_request_error"
    return err


async def _on_gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    return exc.response()


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        return NotFound(f"Not found: {request.url.path}").response()
    return _status_error(exc.status_code, str(exc.detail), exc.headers or {}).response()


async def _on_unhandled(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s: %r", request.method, request.url.path, exc)
    return _status_error(500, "Internal gateway error", {}).response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _on_gateway_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unhandled)
