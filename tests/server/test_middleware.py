"""Body-size limit (by header and by streamed bytes) and API-key checks, as pure ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from surge.server.errors import install_error_handlers
from surge.server.middleware import ApiKeyMiddleware, BodySizeLimitMiddleware
from surge.server.protocol import CompletionRequest

LIMIT = 100


def make_app(*, max_bytes: int | None = None, api_keys: set[str] | None = None) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.state.calls = 0

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw: Request) -> dict[str, Any]:
        raw.app.state.calls += 1
        return {"prompt": request.prompt}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/stream")
    async def stream() -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for i in range(3):
                yield f"data: {i}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")

    if max_bytes is not None:
        app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_bytes)
    if api_keys is not None:
        app.add_middleware(ApiKeyMiddleware, api_keys=api_keys)
    return app


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def assert_413(resp: httpx.Response) -> None:
    assert resp.status_code == 413
    assert resp.json() == {
        "error": {
            "message": f"request body is larger than {LIMIT} bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }


async def test_body_under_limit_passes() -> None:
    app = make_app(max_bytes=LIMIT)
    async with client_for(app) as c:
        resp = await c.post("/v1/completions", json={"prompt": "hi"})
    assert resp.status_code == 200 and resp.json() == {"prompt": "hi"}


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (rb'{"prompt": "\ud800 x"}', 400),  # a lone high surrogate: no character
        (rb'{"prompt": ["ok", "\uDC00"]}', 400),  # a lone low one, in a list
        (rb'{"prompt": "\ud83d\ude00"}', 200),  # a pair: one emoji, fine
        (rb'{"prompt": "\\ud800"}', 200),  # an escaped backslash, then text
    ],
)
async def test_a_lone_surrogate_is_refused_before_the_route(body: bytes, status: int) -> None:
    app = make_app(max_bytes=LIMIT)
    async with client_for(app) as c:
        resp = await c.post("/v1/completions", content=chunks(body[:9], body[9:]),
                            headers={"content-type": "application/json"})  # fmt: skip
    assert resp.status_code == status
    if status == 400:
        assert resp.json()["error"]["code"] == "invalid_unicode" and app.state.calls == 0


async def test_body_over_limit_by_content_length() -> None:
    app = make_app(max_bytes=LIMIT)
    async with client_for(app) as c:
        resp = await c.post("/v1/completions", json={"prompt": "x" * 200})
    assert_413(resp)
    assert app.state.calls == 0


async def test_body_over_limit_by_streamed_size() -> None:
    app = make_app(max_bytes=LIMIT)
    body = b'{"prompt": "' + b"x" * 150 + b'"}'
    async with client_for(app) as c:
        # A generator body is sent chunked, without Content-Length.
        resp = await c.post(
            "/v1/completions",
            content=chunks(body[:60], body[60:120], body[120:]),
            headers={"content-type": "application/json"},
        )
    assert "content-length" not in resp.request.headers
    assert_413(resp)
    assert app.state.calls == 0


async def test_streamed_body_over_limit_in_raw_asgi_app() -> None:
    seen: list[bytes] = []

    async def raw_app(scope: Scope, receive: Receive, send: Send) -> None:
        while True:  # reads without catching: the limit error propagates out of the app
            message = await receive()
            seen.append(message.get("body", b""))
            if not message.get("more_body"):
                break

    async with client_for(BodySizeLimitMiddleware(raw_app, max_bytes=LIMIT)) as c:
        resp = await c.post("/", content=chunks(b"a" * 60, b"b" * 60))
    assert_413(resp)
    assert seen == [b"a" * 60]


async def test_streaming_response_passes_through() -> None:
    app = make_app(max_bytes=LIMIT, api_keys={"k1"})
    async with client_for(app) as c:
        resp = await c.get("/v1/stream", headers={"Authorization": "Bearer k1"})
    assert resp.status_code == 200 and resp.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"Authorization": "Bearer k1"}, 200, None),
        ({"Authorization": "bearer  k2 "}, 200, None),
        ({}, 401, "missing API key: send it as 'Authorization: Bearer <key>'"),
        ({"Authorization": "Bearer nope"}, 401, "invalid API key"),
        ({"Authorization": "Bearer "}, 401, "invalid API key"),
        ({"Authorization": "Basic k1"}, 401, "invalid API key"),
        ({"Authorization": "k1"}, 401, "invalid API key"),
    ],
)
async def test_api_key(headers: dict[str, str], status: int, message: str | None) -> None:
    app = make_app(api_keys={"k1", "k2"})
    async with client_for(app) as c:
        resp = await c.post("/v1/completions", json={"prompt": "hi"}, headers=headers)
    assert resp.status_code == status
    if message is not None:
        assert resp.headers["www-authenticate"] == "Bearer"
        assert resp.json() == {
            "error": {
                "message": message,
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
        assert app.state.calls == 0


async def test_api_key_exempt_paths_and_preflight() -> None:
    app = make_app(api_keys={"k1"})
    async with client_for(app) as c:
        assert (await c.get("/health")).status_code == 200
        # Unknown routes are not exempt: no probing without a key.
        assert (await c.get("/v1/models")).status_code == 401
        # A CORS preflight carries no credentials; the router answers it (405 here, no CORS).
        assert (await c.options("/v1/completions")).status_code == 405


def test_api_key_middleware_needs_a_key() -> None:
    async def noop(scope: Scope, receive: Receive, send: Send) -> None:
        return None

    with pytest.raises(ValueError, match="api_keys"):
        ApiKeyMiddleware(noop, api_keys={""})
