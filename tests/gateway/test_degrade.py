"""Saturation decisions, the max_tokens cap, and the concurrency limiter's queue."""

from __future__ import annotations

import asyncio

import pytest

from surge.gateway.config import DegradeAction, DegradeConfig, LimitConfig
from surge.gateway.degrade import all_saturated, cap_max_tokens, decide, is_saturated
from surge.gateway.limits import ConcurrencyLimiter, LimitExceeded
from surge.gateway.upstreams import UpstreamSnapshot


def snap(in_flight: int = 0, limit: int | None = 2, waiting: int | None = None) -> UpstreamSnapshot:
    return UpstreamSnapshot("http://a:1", in_flight=in_flight, max_in_flight=limit,
                            num_waiting=waiting)  # fmt: skip


def test_saturation_by_in_flight_or_reported_queue() -> None:
    cfg = DegradeConfig(max_waiting=4)
    assert not is_saturated(snap(1), cfg)
    assert is_saturated(snap(2), cfg)
    assert not is_saturated(snap(9, limit=None), cfg)
    assert is_saturated(snap(0, waiting=5), cfg)
    assert not is_saturated(snap(0, waiting=4), cfg)
    assert not all_saturated([], cfg)
    assert not all_saturated([snap(2), snap(1)], cfg)


def test_decide_per_action() -> None:
    full, free = [snap(2), snap(3)], [snap(0)]
    cap = DegradeConfig(action=DegradeAction.CAP_MAX_TOKENS, max_tokens_cap=32)
    assert decide(full, [], cap).header == "max_tokens=32"
    assert decide([snap(2), snap(0)], [], cap).action is DegradeAction.NONE
    fb = DegradeConfig(action=DegradeAction.FALLBACK)
    assert decide(full, free, fb).header == "fallback"
    assert decide(full, [snap(5)], fb).action is DegradeAction.SHED  # fallback is full too
    assert decide(full, [], fb).action is DegradeAction.SHED
    assert decide(full, free, DegradeConfig()).action is DegradeAction.NONE


def test_cap_max_tokens_keeps_smaller_requests_and_the_original_body() -> None:
    body = {"prompt": "x", "max_tokens": 500}
    assert cap_max_tokens(body, 64) == {"prompt": "x", "max_tokens": 64}
    assert body["max_tokens"] == 500
    assert cap_max_tokens({"max_tokens": 10}, 64) == {"max_tokens": 10}
    assert cap_max_tokens({}, 64) == {"max_tokens": 64}
    chat = {"max_completion_tokens": 900, "max_tokens": None}
    assert cap_max_tokens(chat, 64) == {"max_completion_tokens": 64, "max_tokens": 64}


async def test_limiter_queues_then_refuses_when_full() -> None:
    lim = ConcurrencyLimiter(LimitConfig(max_concurrency=2, max_queue=1, queue_timeout_s=5))
    await lim.acquire("k")
    await lim.acquire("k")
    waiter = asyncio.create_task(lim.acquire("k"))
    await asyncio.sleep(0)
    assert lim.num_waiting == 1
    with pytest.raises(LimitExceeded) as e:
        await lim.acquire("k")
    assert e.value.reason == "queue_full"
    lim.release("k")
    await asyncio.wait_for(waiter, 1)
    assert lim.in_flight == 2 and lim.num_waiting == 0


async def test_limiter_queue_timeout_frees_the_place() -> None:
    lim = ConcurrencyLimiter(LimitConfig(max_concurrency=1, max_queue=1, queue_timeout_s=0.05))
    await lim.acquire("k")
    with pytest.raises(LimitExceeded) as e:
        await lim.acquire("k")
    assert e.value.reason == "queue_timeout" and lim.num_waiting == 0
    lim.release("k")
    await lim.acquire("k")  # the slot came back


async def test_limiter_per_key_cap_does_not_block_other_keys() -> None:
    cfg = LimitConfig(max_concurrency=3, max_concurrency_per_key=1, max_queue=4)
    lim = ConcurrencyLimiter(cfg)
    await lim.acquire("a")
    blocked = asyncio.create_task(lim.acquire("a"))  # a's own limit holds it back ...
    await asyncio.sleep(0)
    await asyncio.wait_for(lim.acquire("b"), 1)  # ... but b goes ahead
    assert not blocked.done()
    lim.release("a")
    await asyncio.wait_for(blocked, 1)
    assert lim.in_flight == 2


async def test_limiter_is_fair_between_keys() -> None:
    """A burst from one key waits behind another key's later requests: a freed slot goes to the
    key with the fewest in flight; with equals, to the earliest."""
    lim = ConcurrencyLimiter(LimitConfig(max_concurrency=2, max_queue=16))
    await lim.acquire("busy")
    await lim.acquire("busy")
    order: list[str] = []

    async def wait(key: str) -> None:
        await lim.acquire(key)
        order.append(key)

    burst = [asyncio.create_task(wait("busy")) for _ in range(4)]
    await asyncio.sleep(0)
    others = [asyncio.create_task(wait(k)) for k in ("quiet", "other")]
    await asyncio.sleep(0)
    lim.release("busy")  # busy 1 in flight, quiet and other none: quiet (the earlier) goes
    await asyncio.sleep(0)
    lim.release("busy")  # busy 0, quiet 1, other 0: busy's first waiter (earliest of the 0s)
    await asyncio.sleep(0)
    lim.release("quiet")  # busy 1, other 0: other
    await asyncio.sleep(0)
    assert order == ["quiet", "busy", "other"]
    for key in ("busy", "other", "busy", "busy"):  # the rest of the burst, one by one
        lim.release(key)
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*burst, *others), 1)
    assert order == ["quiet", "busy", "other", "busy", "busy", "busy"]


async def test_limiter_cancelled_waiter_leaves_no_trace() -> None:
    lim = ConcurrencyLimiter(LimitConfig(max_concurrency=1, max_queue=2))
    await lim.acquire("k")
    waiter = asyncio.create_task(lim.acquire("k"))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.sleep(0)
    lim.release("k")
    assert lim.in_flight == 0 and lim.num_waiting == 0
