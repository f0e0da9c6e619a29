"""Scheduling policies end to end: real servers on 127.0.0.1, tenants and priorities over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import ServerProcess

COMP = "/v1/completions"


def body(max_tokens: int, **extra: object) -> dict[str, object]:
    return {"prompt": "Tell me a story.", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, **extra}  # fmt: skip


async def wait_for(
    server: ServerProcess, metric: str, at_least: float, timeout_s: float = 20
) -> None:
    """Poll /metrics without blocking the event loop the requests run on."""
    deadline = time.monotonic() + timeout_s
    while await asyncio.to_thread(server.metric, metric) < at_least:
        assert time.monotonic() < deadline, f"{metric} never reached {at_least}"
        await asyncio.sleep(0.05)


async def timed_post(
    client: httpx.AsyncClient, url: str, payload: dict[str, object], **kw: object
) -> tuple[float, httpx.Response]:
    r = await client.post(url, json=payload, **kw)  # type: ignore[arg-type]
    return time.monotonic(), r


@pytest.fixture(scope="module")
def priority_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    # One sequence slot: every admission decision is visible in completion order.
    server = ServerProcess(
        tiny_model_dir, "--dtype", "float32", "--scheduling-policy", "priority",
        "--max-num-seqs", "1", "--priority-aging-s", "60",
        "--max-queue-wait", "0",  # the order is the subject, not shedding a long queue wait
    )  # fmt: skip
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fair_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tiny_model_dir, "--dtype", "float32", "--scheduling-policy", "fair",
        "--max-num-seqs", "1", "--max-queued-requests-per-tenant", "4",
        "--max-queue-wait", "0",  # the order is the subject, not shedding a long queue wait
    )  # fmt: skip
    yield server
    server.stop()


async def test_urgent_request_jumps_the_queue_and_preempts(priority_server: ServerProcess) -> None:
    url = priority_server.url + COMP
    async with httpx.AsyncClient(timeout=120) as client:
        running = asyncio.create_task(timed_post(client, url, body(1000, priority=5)))
        await wait_for(priority_server, "vllm:num_requests_running", 1)
        queued = [
            asyncio.create_task(timed_post(client, url, body(40, priority=5))) for _ in range(3)
        ]
        await wait_for(priority_server, "vllm:num_requests_waiting", 3)
        # Priority by header (as a gateway sends it); the body has none.
        urgent_done, urgent = await timed_post(
            client, url, body(8), headers={"x-surge-priority": "0"}
        )
        results = await asyncio.gather(running, *queued)
    assert urgent.status_code == 200
    assert all(r.status_code == 200 for _, r in results)
    # It finished before any queued low-priority request, and before the running one, which
    # it preempted; that one still completes every token.
    assert all(urgent_done < done for done, _ in results)
    assert results[0][1].json()["usage"]["completion_tokens"] == 1000
    assert priority_server.metric("vllm:num_preemptions_total") >= 1


def test_bad_priority_header_is_400(priority_server: ServerProcess) -> None:
    r = httpx.post(priority_server.url + COMP, json=body(2), headers={"x-surge-priority": "urgent"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "priority"


async def test_fair_share_serves_a_light_tenant_before_the_flood(
    fair_server: ServerProcess,
) -> None:
    url = fair_server.url + COMP
    heavy = {"x-surge-tenant": "heavy"}
    async with httpx.AsyncClient(timeout=120) as client:
        # The first holds the one slot long enough, on a fast machine too, for 4 more to queue
        # behind it; their length does not matter to the order.
        flood = [asyncio.create_task(timed_post(client, url, body(1000), headers=heavy))]
        await wait_for(fair_server, "vllm:num_requests_running", 1)
        flood += [
            asyncio.create_task(timed_post(client, url, body(40), headers=heavy)) for _ in range(4)
        ]
        await wait_for(fair_server, "vllm:num_requests_waiting", 4)
        # The per-tenant bound (4 queued) refuses heavy's next request...
        refused = await client.post(url, json=body(4), headers=heavy)
        # ...but not another tenant's, named by the OpenAI `user` field this time.
        light_done, light = await timed_post(client, url, body(30, user="light"))
        results = await asyncio.gather(*flood)
    assert refused.status_code == 429 and refused.headers.get("retry-after")
    assert refused.json()["error"]["code"] == "tenant_queue_full"
    assert light.status_code == 200 and all(r.status_code == 200 for _, r in results)
    # FCFS would run light last; fair share runs it as soon as the slot frees.
    assert sum(done > light_done for done, _ in results) >= 3
    heavy_tokens = fair_server.metric("surge:tenant_scheduled_tokens_total", tenant="heavy")
    assert heavy_tokens > 0
    assert fair_server.metric("surge:tenant_time_to_first_token_seconds_count", tenant="light") == 1
    assert fair_server.metric("surge:priority_queue_time_seconds_count", priority="0") >= 6
