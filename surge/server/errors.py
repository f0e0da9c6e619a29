"""HTTP-edge exceptions and handlers that render every failure in the OpenAI error shape.

Clients (the `openai` SDK included) parse `{"error": {"message", "type", "param", "code"}}`
for every non-2xx status, so 404s, 405s, validation failures and crashes all use it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)


class SurgeHTTPError(Exception):
    """Base of all errors the server turns into an HTTP response; subclasses fix the status."""

    status_code: int = 500
    type: str = "server_error"
    default_code: str | int | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers: dict[str, str] = dict(headers or {})


class BadRequestError(SurgeHTTPError):
    status_code = 400
    type = "invalid_request_error"


class AuthenticationError(SurgeHTTPError):
    status_code = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class NotFoundError(SurgeHTTPError):
    status_code = 404
    type = "not_found_error"

    @classmethod
    def model_not_found(cls, model: str) -> NotFoundError:
        return cls(f"The model `{model}` does not exist.", param="model", code="model_not_found")


class PayloadTooLargeError(SurgeHTTPError):
    status_code = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


def retry_after_header(seconds: float) -> str:
    """Retry-After must be a whole number of seconds; round up so clients never retry early."""
    if not math.isfinite(seconds) or seconds <= 1.0:
        return "1"
    return str(math.ceil(seconds))


class _RetryableError(SurgeHTTPError):
    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float = 1.0,
        param: str | None = None,
        code: str | int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        merged = {"Retry-After": retry_after_header(retry_after_s), **(headers or {})}
        super().__init__(message, param=param, code=code, headers=merged)
        self.retry_after_s = retry_after_s


class RateLimitError(_RetryableError):
    status_code = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class ServiceUnavailableError(_RetryableError):
    status_code = 503
    type = "service_unavailable_error"
    default_code = "service_unavailable"


class RequestTimeoutError(SurgeHTTPError):
    status_code = 504
    type = "timeout_error"
    default_code = "timeout"


TimeoutError_ = RequestTimeoutError


class InternalError(SurgeHTTPError):
    status_code = 500
    type = "server_error"
    default_code = "internal_error"


def error_body(exc: SurgeHTTPError) -> dict[str, Any]:
    """The OpenAI error object; also what a stream sends as its last `data:` event on failure."""
    return {
        "error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}
    }


def error_response(exc: SurgeHTTPError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status_code, headers=exc.headers or None)


# Pydantic puts union-member tags ("str", "list[int]", "TextPart", "function-after[...]") into
# `loc`; they are not fields the client wrote, so they are dropped from the reported path.
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})
_SOURCES = frozenset({"body", "query", "path", "header", "cookie"})


def _field_path(loc: Sequence[int | str]) -> str | None:
    parts = list(loc)
    if parts and parts[0] in _SOURCES:
        parts = parts[1:]
    kept: list[str] = []
    for part in parts:
        if isinstance(part, int):
            kept.append(str(part))
        elif part.isidentifier() and part not in _TYPE_TAGS and not part[0].isupper():
            kept.append(part)
    return ".".join(kept) or None


def _clean_msg(msg: str) -> str:
    # ValueErrors raised by our validators arrive as "Value error, <our message>".
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def validation_error_to_bad_request(errors: Sequence[Mapping[str, Any]]) -> BadRequestError:
    """Turn pydantic/FastAPI error dicts into one readable 400 naming the first bad field."""
    if not errors:
        return BadRequestError("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "malformed JSON")
        return BadRequestError(f"invalid JSON in request body: {detail}", code="invalid_json")
    param = _field_path(first.get("loc", ()))
    if first.get("type") == "missing" and param is None:
        return BadRequestError("request body is required (a JSON object)")
    # Every union member reports its own failure for the same field; say them all, once.
    msgs: list[str] = []
    for err in errors:
        if _field_path(err.get("loc", ())) == param:
            msg = _clean_msg(str(err.get("msg", "invalid value")))
            if msg not in msgs:
                msgs.append(msg)
    text = " or ".join(msgs)
    return BadRequestError(f"{param}: {text}" if param else text, param=param)


def _http_exception_error(request: Request, exc: StarletteHTTPException) -> SurgeHTTPError:
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        err: SurgeHTTPError = NotFoundError(f"Not found: {request.url.path}", headers=headers)
    elif exc.status_code == 405:
        err = BadRequestError(
            f"Method {request.method} not allowed for {request.url.path}",
            code="method_not_allowed",
            headers=headers,
        )
    else:
        err = SurgeHTTPError(str(exc.detail), headers=headers)
        err.type = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    err.status_code = exc.status_code
    return err


async def _on_surge_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SurgeHTTPError)
    return error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(validation_error_to_bad_request(exc.errors()))


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return error_response(_http_exception_error(request, exc))


async def _on_unhandled(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this response so the server still logs the traceback;
    # the client only learns that it failed, never internals.
    logger.error("unhandled error on %s %s: %r", request.method, request.url.path, exc)
    return error_response(InternalError("Internal server error"))


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure on `app` through the OpenAI error shape."""
    app.add_exception_handler(SurgeHTTPError, _on_surge_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unhandled)
