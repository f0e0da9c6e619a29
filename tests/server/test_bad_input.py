"""Every bad-input case gets its status and the OpenAI error shape, and the server keeps serving."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.servers import ServerProcess

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": MSG, "temperature": "hot"}, "temperature"),
        (CHAT, {"messages": MSG, "max_tokens": "12"}, "max_tokens"),
        (CHAT, {"messages": MSG, "n": True}, "n"),
        (CHAT, {"messages": MSG, "temperature": -1}, "temperature"),
        (CHAT, {"messages": MSG, "top_p": 0}, "top_p"),
        (CHAT, {"messages": MSG, "n": 0}, "n"),
        (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (CHAT, {"messages": MSG, "max_tokens": 0}, "max_tokens"),
        (CHAT, {"messages": []}, "messages"),
        (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, None),
        (CHAT, {}, "messages"),
        (COMP, {"prompt": ""}, "prompt"),
        (COMP, {"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
        (COMP, {"prompt": [99999999]}, "prompt"),
        (COMP, {"prompt": "x", "max_tokens": 100000}, "max_tokens"),
        (COMP, {"prompt": "x", "logit_bias": {"cat": 1}}, "logit_bias"),
        (COMP, {"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
        (CHAT, {"messages": MSG, "logit_bias": {"99999999": 1}}, "logit_bias"),
        (CHAT, {"messages": MSG, "allowed_token_ids": []}, "allowed_token_ids"),
        (COMP, {"prompt": "x", "allowed_token_ids": [1, 99999999]}, "allowed_token_ids"),
        (COMP, {"prompt": "x", "bad_words": [""]}, "bad_words"),
    ],
)
def test_bad_request_400(
    tiny_server: ServerProcess, path: str, body: dict[str, Any], param: str | None
) -> None:
    r = httpx.post(tiny_server.url + path, json={"model": "test-model", **body})
    assert_error(r, 400, param)


def test_malformed_json_400(tiny_server: ServerProcess) -> None:
    r = httpx.post(
        tiny_server.url + CHAT,
        content=b'{"messages": [',
        headers={"content-type": "application/json"},
    )
    assert_error(r, 400)


def test_unknown_fields_ignored(tiny_server: ServerProcess) -> None:
    r = httpx.post(
        tiny_server.url + CHAT,
        json={"messages": MSG, "max_tokens": 2, "logit_bias": {}, "some_future_field": 1},
    )
    assert r.status_code == 200, r.text


def test_context_length_names_the_limit(tiny_server: ServerProcess) -> None:
    r = httpx.post(tiny_server.url + COMP, json={"prompt": "word " * 3000, "max_tokens": 10})
    err = assert_error(r, 400)
    assert "maximum context length" in err["message"] and err["code"] == "context_length_exceeded"


def test_unknown_model_404(tiny_server: ServerProcess) -> None:
    r = httpx.post(tiny_server.url + CHAT, json={"model": "gpt-9", "messages": MSG})
    err = assert_error(r, 404, "model")
    assert err["code"] == "model_not_found"
    c = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-9", messages=MSG)  # type: ignore[arg-type]


def test_body_too_large_413(tiny_server: ServerProcess) -> None:
    r = httpx.post(tiny_server.url + COMP, json={"prompt": "x" * (5 * 1024 * 1024)})
    assert_error(r, 413)


def test_unknown_route_404_shape(tiny_server: ServerProcess) -> None:
    assert_error(httpx.get(tiny_server.url + "/v1/nothing"), 404)


def test_openai_client_raises_bad_request(tiny_server: ServerProcess) -> None:
    c = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model="test-model", prompt="x", temperature=-2)
    assert info.value.status_code == 400
    # ...and the server still serves.
    ok = c.completions.create(model="test-model", prompt="x", max_tokens=2)
    assert ok.choices[0].text is not None
