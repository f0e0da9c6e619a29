"""The gateway's own errors, each rendered in the OpenAI shape
`{"error": {"message", "type", "param", "code"}}`, as a response or as a last SSE event.
(Errors an upstream returns pass through untouched.)"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException

from surge.http.openai_errors import OpenAIError, install_openai_error_handlers, status_error

SSE_DONE = b"data: [DONE]\n\n"


class GatewayError(OpenAIError):
    """Base of the errors the gateway answers itself; subclasses fix the status."""

    status_code = 502
    type = "upstream_error"
    default_code = "bad_gateway"


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


def _from_http_exception(request: Request, exc: StarletteHTTPException) -> OpenAIError:
    if exc.status_code == 404:
        return NotFound(f"Not found: {request.url.path}")
    return status_error(
        exc.status_code, str(exc.detail), code="http_error", headers=exc.headers or {}
    )


def install_error_handlers(app: FastAPI) -> None:
    install_openai_error_handlers(
        app,
        from_http_exception=_from_http_exception,
        internal_error=lambda: status_error(500, "Internal gateway error", code="http_error"),
    )
