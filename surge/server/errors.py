"""HTTP-edge exceptions and handlers that render every failure in the OpenAI error shape.

Clients (the `openai` SDK included) parse `{"error": {"message", "type", "param", "code"}}`
for every non-2xx status, so 404s, 405s, validation failures and crashes all use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from surge.http.openai_errors import (
    OpenAIError,
    install_openai_error_handlers,
    status_error,
)
from surge.http.openai_errors import retry_after_header as retry_after_header  # re-exported


class SurgeHTTPError(OpenAIError):
    """Base of all errors the server turns into an HTTP response; subclasses fix the status."""


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


class _RetryableError(SurgeHTTPError):
    """Always carries Retry-After (1 s unless told)."""

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float = 1.0,
        param: str | None = None,
        code: str | int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            message, param=param, code=code, retry_after_s=retry_after_s, headers=headers
        )
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


def error_body(exc: OpenAIError) -> dict[str, Any]:
    """The OpenAI error object; also what a stream sends as its last `data:` event on failure."""
    return exc.body()


def error_response(exc: OpenAIError) -> JSONResponse:
    return exc.response()


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


def _http_exception_error(request: Request, exc: StarletteHTTPException) -> OpenAIError:
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        return NotFoundError(f"Not found: {request.url.path}", headers=headers)
    if exc.status_code == 405:
        err: OpenAIError = BadRequestError(
            f"Method {request.method} not allowed for {request.url.path}",
            code="method_not_allowed",
            headers=headers,
        )
        err.status_code = 405
        return err
    return status_error(exc.status_code, str(exc.detail), headers=headers)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error_to_bad_request(exc.errors()).response()


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure on `app` through the OpenAI error shape."""
    install_openai_error_handlers(
        app,
        from_http_exception=_http_exception_error,
        internal_error=lambda: InternalError("Internal server error"),
    )
    app.add_exception_handler(RequestValidationError, _on_validation_error)
