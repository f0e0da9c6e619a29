"""Pure ASGI middlewares (BaseHTTPMiddleware would buffer streams and hide client disconnects).

Both answer in the OpenAI error shape so clients parse every refusal the same way.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from surge.http.unicode_check import body_has_lone_surrogate
from surge.server.errors import (
    AuthenticationError,
    BadRequestError,
    PayloadTooLargeError,
    SurgeHTTPError,
    error_response,
)

DEFAULT_EXEMPT_PATHS = frozenset(
    {"/health", "/health/live", "/health/ready", "/health/startup", "/metrics", "/version"}
)


async def _send_error(exc: SurgeHTTPError, scope: Scope, receive: Receive, send: Send) -> None:
    await error_response(exc)(scope, receive, send)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


class _BodyTooLarge(Exception):
    pass


def _unicode_refusal(body: bytes) -> SurgeHTTPError | None:
    """A 400 for a JSON body whose strings hold a lone surrogate escape ("\ud800"): valid JSON,
    but no text (a tokenizer, or the UTF-8 of an answer echoing it, fails on it later)."""
    if not body_has_lone_surrogate(body):
        return None
    return BadRequestError(
        "the request body holds a lone UTF-16 surrogate escape (such as \\ud800) in a "
        "string: not a character; send text as valid Unicode",
        code="invalid_unicode",
    )


class BodySizeLimitMiddleware:
    """413 for request bodies over `max_bytes`: by Content-Length before reading, or by counting
    streamed chunks (chunked uploads, or a Content-Length that lies). And 400 for a JSON body
    with a lone UTF-16 surrogate in a string, before any route reads it."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, path_limits: Mapping[str, int] | None = None
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes
        # Paths with a limit of their own (file uploads): their routes check what they read, so
        # the body is neither held for the JSON check nor refused at the default limit.
        self.path_limits = dict(path_limits or {})

    def _error(self, max_bytes: int) -> PayloadTooLargeError:
        return PayloadTooLargeError(f"request body is larger than {max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.path_limits.get(scope["path"], self.max_bytes)
        json_body = scope["path"] not in self.path_limits
        declared = _header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            await _send_error(self._error(max_bytes), scope, receive, send)
            return

        received = 0
        exceeded = False
        refused: SurgeHTTPError | None = None
        response_started = False
        chunks: list[bytes] = []

        async def limited_receive() -> Message:
            nonlocal received, exceeded, refused
            if exceeded:
                raise _BodyTooLarge
            message = await receive()
            if message["type"] == "http.request":
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > max_bytes:
                    exceeded = True
                    raise _BodyTooLarge
                if json_body:
                    chunks.append(chunk)
                if json_body and not message.get("more_body", False):
                    refused = _unicode_refusal(b"".join(chunks))
                    chunks.clear()
                    if refused is not None:
                        exceeded = True  # refused like an oversized body: the app never sees it
                        raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            # The app may turn our exception into its own error response (FastAPI answers 400
            # to a body-read failure); swallow that so the client gets the 413.
            if exceeded and not response_started:
                return
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            # Whatever the app raised after the limit tripped is a consequence of it.
            if not exceeded or response_started:
                raise
        if exceeded and not response_started:
            await _send_error(refused or self._error(max_bytes), scope, receive, send)


class ApiKeyMiddleware:
    """401 unless `Authorization: Bearer <key>` names one of `api_keys`; exempt paths
    (health probes, metrics scrapes) and CORS preflights pass without a key."""

    def __init__(
        self,
        app: ASGIApp,
        api_keys: Iterable[str],
        exempt_paths: Iterable[str] = DEFAULT_EXEMPT_PATHS,
    ) -> None:
        keys = [k.encode() for k in api_keys if k]
        if not keys:
            raise ValueError("api_keys must contain at least one non-empty key")
        self.app = app
        self._keys = keys
        self.exempt_paths = frozenset(exempt_paths)

    def _authorized(self, header: bytes | None) -> bool:
        if header is None:
            return False
        scheme, _, token = header.strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        token = token.strip()
        # Compare against every key, without stopping early, so timing reveals nothing.
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(token, key)
        return matched

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] == "OPTIONS"
            or scope["path"] in self.exempt_paths
            or self._authorized(_header(scope, b"authorization"))
        ):
            await self.app(scope, receive, send)
            return
        missing = _header(scope, b"authorization") is None
        message = (
            "missing API key: send it as 'Authorization: Bearer <key>'"
            if missing
            else "invalid API key"
        )
        exc = AuthenticationError(message, headers={"WWW-Authenticate": "Bearer"})
        await _send_error(exc, scope, receive, send)


class ArrivalTimeMiddleware:
    """Stamps `scope["state"]["arrival_s"]` (time.monotonic) before the body is even read, so
    the server's own overhead (parse, validate, tokenize, admit) can be measured."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["arrival_s"] = time.monotonic()
        await self.app(scope, receive, send)
