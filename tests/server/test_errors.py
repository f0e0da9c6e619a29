"""Every failure at the HTTP edge renders as the OpenAI error object with the right status."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from surge.server.errors import (
    AuthenticationError,
    BadRequestError,
    InternalError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    RequestTimeoutError,
    ServiceUnavailableError,
    SurgeHTTPError,
    TimeoutError_,
    error_body,
    install_error_handlers,
    retry_after_header,
    validation_error_to_bad_request,
)
from surge.server.protocol import CompletionRequest

CASES: list[tuple[SurgeHTTPError, int, str, str | int | None]] = [
    (BadRequestError("bad", param="x"), 400, "invalid_request_error", None),
    (AuthenticationError("who?"), 401, "authentication_error", "invalid_api_key"),
    (NotFoundError.model_not_found("gpt-9"), 404, "not_found_error", "model_not_found"),
    (PayloadTooLargeError("big"), 413, "invalid_request_error", "request_too_large"),
    (
        RateLimitError("slow down", retry_after_s=2.5),
        429,
        "rate_limit_error",
        "rate_limit_exceeded",
    ),
    (ServiceUnavailableError("draining"), 503, "service_unavailable_error", "service_unavailable"),
    (RequestTimeoutError("too slow"), 504, "timeout_error", "timeout"),
    (InternalError("boom"), 500, "server_error", "internal_error"),
]


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raise/{i}")
    async def raise_case(i: int) -> None:
        raise CASES[i][0]

    @app.get("/crash")
    async def crash() -> None:
        raise RuntimeError("secret internal detail")

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        return {"ok": True}

    return app


async def request(method: str, path: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=make_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.request(method, path, **kwargs)


def test_retry_after_rounds_up_to_whole_seconds_min_one() -> None:
    assert [retry_after_header(s) for s in (0.0, 0.2, 1.0, 1.01, 2.5, 30.0)] == [
        "1",
        "1",
        "1",
        "2",
        "3",
        "30",
    ]
    assert retry_after_header(float("nan")) == "1"


def test_exception_attributes_and_body() -> None:
    exc = RateLimitError("slow down", retry_after_s=2.5, param="p")
    assert exc.status_code == 429 and exc.retry_after_s == 2.5
    assert exc.headers == {"Retry-After": "3"}
    assert error_body(exc) == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": "p",
            "code": "rate_limit_exceeded",
        }
    }
    assert ServiceUnavailableError("x").headers == {"Retry-After": "1"}
    assert TimeoutError_ is RequestTimeoutError
    assert BadRequestError("x", code="custom").code == "custom"


@pytest.mark.parametrize("i", range(len(CASES)))
async def test_each_error_maps_to_status_and_shape(i: int) -> None:
    exc, status, type_, code = CASES[i]
    resp = await request("GET", f"/raise/{i}")
    assert resp.status_code == status
    assert resp.json() == {
        "error": {"message": exc.message, "type": type_, "param": exc.param, "code": code}
    }
    if status in (429, 503):
        assert resp.headers["retry-after"] == exc.headers["Retry-After"]


async def test_validation_error_is_400_naming_the_field() -> None:
    resp = await request("POST", "/v1/completions", json={"prompt": "hi", "temperature": "hot"})
    assert resp.status_code == 400
    assert resp.json() == {
        "error": {
            "message": "temperature: Input should be a valid number",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": None,
        }
    }


async def test_union_errors_are_reported_once_without_type_tags() -> None:
    resp = await request("POST", "/v1/completions", json={"prompt": 5})
    err = resp.json()["error"]
    assert resp.status_code == 400 and err["param"] == "prompt"
    assert err["message"].startswith("prompt: prompt must be a string, a list of strings")


async def test_malformed_json_is_400() -> None:
    resp = await request(
        "POST",
        "/v1/completions",
        content=b'{"prompt": "hi",',
        headers={"content-type": "application/json"},
    )
    err = resp.json()["error"]
    assert resp.status_code == 400
    assert err["message"].startswith("invalid JSON in request body")
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_json"


async def test_missing_body_is_400() -> None:
    resp = await request("POST", "/v1/completions")
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "request body is required (a JSON object)"


async def test_non_object_body_is_400() -> None:
    resp = await request("POST", "/v1/completions", json=[1, 2])
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] is None


async def test_unknown_route_is_404_in_openai_shape() -> None:
    resp = await request("GET", "/v1/nope")
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {
            "message": "Not found: /v1/nope",
            "type": "not_found_error",
            "param": None,
            "code": None,
        }
    }


async def test_wrong_method_is_405_in_openai_shape() -> None:
    resp = await request("GET", "/v1/completions")
    assert resp.status_code == 405
    assert resp.headers["allow"] == "POST"
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "method_not_allowed"


async def test_unhandled_exception_is_500_without_internals() -> None:
    resp = await request("GET", "/crash")
    assert resp.status_code == 500
    assert resp.json() == {
        "error": {
            "message": "Internal server error",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    assert "secret" not in resp.text


def test_validation_error_conversion_handles_nested_paths() -> None:
    exc = validation_error_to_bad_request(
        [
            {
                "type": "literal_error",
                "loc": ("body", "messages", 0, "role"),
                "msg": "Input should be 'system' or 'user'",
            }
        ]
    )
    assert exc.param == "messages.0.role"
    assert exc.message == "messages.0.role: Input should be 'system' or 'user'"
    tagged = validation_error_to_bad_request(
        [{"type": "int_type", "loc": ("body", "x", "list[int]", 2), "msg": "Value error, bad"}]
    )
    assert tagged.param == "x.2" and tagged.message == "x.2: bad"
