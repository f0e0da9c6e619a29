"""Overload, timeouts, disconnects, API keys and rate limits against real servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.servers import ServerProcess

LONG = {"prompt": "Tell me a story.", "max_tokens": 200, "ignore_eos": True, "temperature": 0}


def wait_idle(server: ServerProcess, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (
            server.metric("vllm:num_requests_running") == 0
            and server.metric("vllm:num_requests_waiting") == 0
            and server.metric("vllm:kv_cache_usage_perc") == 0.0
        ):
            return
        time.sleep(0.1)
    raise AssertionError("engine did not return to idle: blocks still held")


@pytest.fixture(scope="module")
def small_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """A server that admits little: 2 running, 4 queued, 1 s timeout, an API key."""
    server = ServerProcess(
        tiny_model_dir, "--max-num-seqs", "2", "--max-queued-requests", "4",
        "--request-timeout", "1.5", "--api-key", "sekret",
    )  # fmt: skip
    yield server
    server.stop()


AUTH = {"Authorization": "Bearer sekret"}


def test_api_key_required(small_server: ServerProcess) -> None:
    url = small_server.url + "/v1/completions"
    r = httpx.post(url, json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(
        url, json={"prompt": "x", "max_tokens": 1}, headers={"Authorization": "Bearer no"}
    )
    assert r.status_code == 401
    r = httpx.post(url, json={"prompt": "x", "max_tokens": 1}, headers=AUTH)
    assert r.status_code == 200
    assert httpx.get(small_server.url + "/health").status_code == 200  # exempt


def test_overload_gets_429_and_admitted_requests_complete(small_server: ServerProcess) -> None:
    async def one(client: httpx.AsyncClient) -> httpx.Response:
        # Short, so admitted ones finish well inside the 1.5 s timeout on a busy machine.
        body = {"prompt": "Count slowly.", "max_tokens": 4, "ignore_eos": True}
        return await client.post("/v1/completions", json=body, headers=AUTH)

    async def flood() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=small_server.url, timeout=60) as client:
            return await asyncio.gather(*[one(client) for _ in range(30)])

    responses = asyncio.run(flood())
    codes = [r.status_code for r in responses]
    assert codes.count(429) > 0, codes
    assert set(codes) <= {200, 429}
    for r in responses:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "queue_full"
        else:  # every admitted request ran to its full length
            assert r.json()["usage"]["completion_tokens"] == 4
    assert small_server.metric("vllm:admission_rejections_total") == codes.count(429)
    wait_idle(small_server)


def test_timeout_aborts_and_frees(small_server: ServerProcess, tiny_model_dir: Path) -> None:
    # The deadlines are far below any CPU's time for 1,900 tokens: on a fast machine the tiny
    # model once finished them inside 1.5 s, so a deadline near that decided nothing.
    body = {**LONG, "max_tokens": 1900}
    server = ServerProcess(tiny_model_dir, "--request-timeout", "0.1")  # the server's own
    try:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
        wait_idle(server)
    finally:
        server.stop()
    # Streaming: the stream ends with an error event instead. The request's own deadline (the
    # header) shortens the server's 1.5 s.
    with httpx.stream(
        "POST", small_server.url + "/v1/completions", json={**body, "stream": True},
        headers={**AUTH, "x-surge-timeout": "0.1"}, timeout=30,
    ) as resp:  # fmt: skip
        assert resp.status_code == 200
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert '"timeout_error"' in lines[-2] and lines[-1] == "data: [DONE]"
    wait_idle(small_server)


def test_disconnect_mid_stream_frees_kv(tiny_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="x", max_retries=0)
    stream = client.completions.create(
        model="test-model", prompt="Tell me a story.", max_tokens=1900, temperature=0,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    for i, _ in enumerate(stream):
        if i == 5:
            break
    assert tiny_server.metric("vllm:num_requests_running") == 1
    stream.close()  # drop the connection mid-stream
    wait_idle(tiny_server, timeout_s=5)
    assert tiny_server.metric("surge:request_aborts_total") >= 1


def test_rate_limit_per_key(tiny_model_dir: Path) -> None:
    server = ServerProcess(tiny_model_dir, "--requests-per-minute", "3")
    try:
        url = server.url + "/v1/completions"
        codes = [
            httpx.post(
                url, json={"prompt": "x", "max_tokens": 1}, headers={"Authorization": "Bearer a"}
            ).status_code
            for _ in range(5)
        ]
        assert codes == [200, 200, 200, 429, 429]
        other = httpx.post(
            url, json={"prompt": "x", "max_tokens": 1}, headers={"Authorization": "Bearer b"}
        )
        assert other.status_code == 200  # another key has its own bucket
        limited = httpx.post(
            url, json={"prompt": "x", "max_tokens": 1}, headers={"Authorization": "Bearer a"}
        )
        assert int(limited.headers["retry-after"]) >= 1
    finally:
        server.stop()
