"""The gateway's failure paths against scripted upstreams (real HTTP on 127.0.0.1, in-loop):
retries elsewhere, refusals, timeouts per phase, broken streams, breaker and health."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from surge.gateway.app import build_app
from surge.gateway.config import (
    BreakerConfig,
    GatewayConfig,
    HealthConfig,
    LimitConfig,
    Policy,
    RetryConfig,
    TimeoutConfig,
    UpstreamConfig,
)
from surge.gateway.state import GatewayState
from tests.gateway.scripted import Script, scripted_app, serving

BASE = GatewayConfig(
    upstreams=(UpstreamConfig("http://placeholder:1"),),
    policy=Policy.ROUND_ROBIN,
    scrape_interval_s=0,
    health=HealthConfig(interval_s=0, outlier_failures=100),
    breaker=BreakerConfig(failure_threshold=3, open_s=60),
    retry=RetryConfig(backoff_base_s=0, backoff_max_s=0),
    timeouts=TimeoutConfig(first_byte_s=2, idle_s=2, total_s=10),
)


@contextlib.asynccontextmanager
async def fleet(
    *scripts: Script, **changes: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, GatewayState]]:
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serving(scripted_app(s))) for s in scripts]
        for script, url in zip(scripts, urls, strict=True):
            script.name = url
        config = dataclasses.replace(
            BASE, upstreams=tuple(UpstreamConfig(u) for u in urls), **changes
        )
        app = build_app(config)
        gateway_url = await stack.enter_async_context(serving(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(base_url=gateway_url, timeout=20)
        )
        yield client, app.state.gateway


async def complete(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, **body})


def sse_data(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


async def metric(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    text = (await client.get("/metrics")).text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + ("{" if labels else " ")):
            got = line[len(name) :].split(" ")[0].strip("{}")
            if ",".join(sorted(got.split(","))) == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_5xx_retries_elsewhere_until_the_breaker_opens() -> None:
    bad, good = Script("a", mode="status", status=500), Script("b")
    async with fleet(bad, good) as (client, _):
        for _ in range(8):
            r = await complete(client)
            assert r.status_code == 200 and r.headers["x-surge-upstream"] == good.name
        assert bad.num_requests == 3  # then its circuit opened and it got no more
        assert await metric(client, "surge_gateway_breaker_state", upstream=bad.name) == 2
        assert await metric(client, "surge_gateway_retries_total", reason="http_500") == 3
        assert await metric(client, "surge_gateway_upstream_errors_total", upstream=bad.name,
                            kind="http_500") == 3  # fmt: skip


async def test_refusals_are_retried_elsewhere_and_never_trip_the_breaker() -> None:
    busy, good = Script("a", mode="status", status=429, retry_after="1"), Script("b")
    async with fleet(busy, good, breaker=BreakerConfig(failure_threshold=1)) as (client, state):
        for _ in range(4):
            assert (await complete(client)).status_code == 200
        assert busy.num_requests >= 1
        assert await metric(client, "surge_gateway_breaker_state", upstream=busy.name) == 0
        assert state.pool.get(busy.name).health.healthy  # type: ignore[union-attr]


async def test_all_refusing_returns_their_status_with_the_smallest_retry_after() -> None:
    a = Script("a", mode="status", status=429, retry_after="7")
    b = Script("b", mode="status", status=503, retry_after="3")
    async with fleet(a, b) as (client, _):
        r = await complete(client)
        assert r.status_code in (429, 503) and r.headers["retry-after"] == "3"
        assert "says" in r.json()["error"]["message"]  # the upstream's own error body
        # Both asked for more of a pause than the gateway waits out itself: 429 at once.
        r = await complete(client)
        assert r.status_code == 429 and r.json()["error"]["code"] == "upstreams_busy"
        assert 1 <= int(r.headers["retry-after"]) <= 3
        assert a.num_requests == b.num_requests == 1


async def test_a_short_retry_after_is_waited_out() -> None:
    busy = Script("a", mode="status", status=429, retry_after="1")
    async with fleet(busy, retry=dataclasses.replace(BASE.retry, max_retry_after_s=2)) as (
        client,
        _,
    ):
        assert (await complete(client)).status_code == 429
        busy.mode = "ok"
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert (await complete(client)).status_code == 200
        assert 0.5 < loop.time() - start < 2.0  # it honoured the upstream's Retry-After


async def test_4xx_passes_through_and_never_trips_the_breaker() -> None:
    picky = Script("a", mode="status", status=400)
    async with fleet(picky, breaker=BreakerConfig(failure_threshold=1)) as (client, _):
        for _ in range(10):
            r = await complete(client)
            assert r.status_code == 400 and r.json()["error"]["code"] == 400
        assert picky.num_requests == 10
        assert await metric(client, "surge_gateway_breaker_state", upstream=picky.name) == 0
        assert (await client.get("/health")).status_code == 200


async def test_first_byte_timeout_moves_a_stream_to_another_upstream() -> None:
    slow, good = Script("a", mode="hang", delay_s=5), Script("b")
    timeouts = TimeoutConfig(first_byte_s=0.3, idle_s=2, total_s=10)
    async with fleet(slow, good, timeouts=timeouts) as (client, _):
        r = await complete(client, stream=True)
        assert r.status_code == 200 and r.headers["x-surge-upstream"] == good.name
        assert sse_data(r.text)[-1] == "[DONE]" and len(sse_data(r.text)) == 4
        assert await metric(client, "surge_gateway_upstream_errors_total", upstream=slow.name,
                            kind="first_byte_timeout") == 1  # fmt: skip


async def test_idle_timeout_ends_a_started_stream_with_an_error_event() -> None:
    stalling = Script("a", mode="stall", delay_s=5)
    timeouts = TimeoutConfig(first_byte_s=2, idle_s=0.3, total_s=10)
    async with fleet(stalling, timeouts=timeouts) as (client, state):
        r = await complete(client, stream=True)
        events = sse_data(r.text)
        assert r.status_code == 200 and len(events) == 3
        assert json.loads(events[0])["choices"][0]["text"] == stalling.name + "0"
        assert json.loads(events[1])["error"]["type"] == "timeout_error"
        assert events[2] == "[DONE]"
        up = state.pool.get(stalling.name)
        assert up is not None and up.in_flight == 0 and state.limiter.in_flight == 0


async def test_a_broken_stream_is_never_replayed() -> None:
    dying, good = Script("a", mode="die"), Script("b")
    async with fleet(dying, good) as (client, _):
        r = await complete(client, stream=True)
        events = sse_data(r.text)
        assert [json.loads(e)["choices"][0]["text"] for e in events[:2]] == [
            dying.name + "0",
            dying.name + "1",
        ]
        err = json.loads(events[2])["error"]
        assert err["code"] == "upstream_stream_broken" and set(err) == {
            "message", "type", "param", "code"
        }  # fmt: skip
        assert events[3:] == ["[DONE]"]
        assert good.num_requests == 0


async def test_no_retry_when_the_budget_is_spent() -> None:
    bad, good = Script("a", mode="status", status=500), Script("b")
    retry = dataclasses.replace(BASE.retry, budget_ratio=0, budget_min_retries=0)
    async with fleet(bad, good, retry=retry) as (client, _):
        r = await complete(client)
        assert r.status_code == 500 and good.num_requests == 0
        assert await metric(client, "surge_gateway_retries_denied_total", reason="budget") == 1


async def test_probes_take_an_upstream_out_and_bring_it_back() -> None:
    flaky, good = Script("a"), Script("b")
    health = HealthConfig(interval_s=0.05, healthy_threshold=2, unhealthy_threshold=2)
    async with fleet(flaky, good, health=health) as (client, state):
        flaky.healthy = False
        await _until(lambda: not state.pool.get(flaky.name).health.healthy)  # type: ignore[union-attr]
        before = flaky.num_requests
        for _ in range(6):
            assert (await complete(client)).headers["x-surge-upstream"] == good.name
        assert flaky.num_requests == before
        flaky.healthy = True
        await _until(lambda: state.pool.get(flaky.name).health.healthy)  # type: ignore[union-attr]
        seen = {(await complete(client)).headers["x-surge-upstream"] for _ in range(4)}
        assert seen == {flaky.name, good.name}
        good.healthy = flaky.healthy = False
        await _until(lambda: len(state.pool.candidates("primary", 1e18)) == 0)
        r = await complete(client)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_upstream"
        assert int(r.headers["retry-after"]) >= 1
        assert (await client.get("/health")).status_code == 503


async def test_a_client_that_leaves_frees_its_slot_and_the_upstream() -> None:
    slow = Script("a", mode="hang", delay_s=30)
    async with fleet(slow, limits=LimitConfig(max_concurrency=1)) as (client, state):
        with contextlib.suppress(httpx.ReadTimeout):  # the client gives up and leaves
            await client.post("/v1/completions", json={"prompt": "x"}, timeout=0.3)
        await _until(lambda: state.limiter.in_flight == 0)
        up = state.pool.get(slow.name)
        assert up is not None
        await _until(lambda: up.in_flight == 0)


async def _until(cond: Any, timeout_s: float = 3.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.02)


async def test_a_client_deadline_is_kept_and_passed_on_as_the_time_left() -> None:
    """x-surge-timeout: the gateway gives up at the client's deadline when it is shorter than
    its own, and tells each attempt's upstream the time left."""
    slow, good = Script("a", mode="hang", delay_s=5), Script("b")
    async with fleet(good) as (client, _):
        r = await client.post(
            "/v1/completions", json={"prompt": "hi"}, headers={"x-surge-timeout": "7.5"}
        )
        assert r.status_code == 200
        assert good.last_headers is not None
        left = float(good.last_headers["x-surge-timeout"])
        assert 7.0 < left <= 7.5  # what was left when it was sent
        await complete(client)
        assert 9.0 < float(good.last_headers["x-surge-timeout"]) <= 10  # total_s, by default
        bad = await client.post("/v1/completions", json={"prompt": "hi"},
                                headers={"x-surge-timeout": "soon"})  # fmt: skip
        assert bad.status_code == 400 and "x-surge-timeout" in bad.json()["error"]["message"]
    async with fleet(slow) as (client, _):
        t0 = time.monotonic()
        r = await client.post("/v1/completions", json={"prompt": "hi"},
                              headers={"x-surge-timeout": "0.5"})  # fmt: skip
        assert r.status_code == 504 and time.monotonic() - t0 < 3


async def test_one_request_id_from_the_client_to_the_upstream_and_back() -> None:
    """X-Request-Id: the client's id goes to the upstream and comes back, on errors too; a
    request without one gets one made at the gateway, sent upstream as well."""
    good = Script("a")
    async with fleet(good) as (client, _):
        r = await client.post(
            "/v1/completions", json={"prompt": "hi"}, headers={"X-Request-Id": "trace-42"}
        )
        assert r.status_code == 200 and r.headers["x-request-id"] == "trace-42"
        assert good.last_headers is not None and good.last_headers["x-request-id"] == "trace-42"
        r = await complete(client)
        made = r.headers["x-request-id"]
        assert len(made) == 32 and good.last_headers["x-request-id"] == made
        headers = {"x-request-id": "e-1", "x-surge-timeout": "soon"}
        bad = await client.post("/v1/completions", json={"prompt": "hi"}, headers=headers)
        assert bad.status_code == 400 and bad.headers["x-request-id"] == "e-1"  # the gateway's
        odd = await client.post("/v1/completions", json={"prompt": "hi"},
                                headers={"x-request-id": "x" * 200})  # fmt: skip
        assert len(odd.headers["x-request-id"]) == 32  # too long: replaced, not passed on
