"""`surge gateway --policy kv_aware` over two real replicas publishing KV events: a prompt
whose long prefix one replica holds goes to that replica (its prefix-cache hits show it), and
when that replica restarts the gateway's index drops what it knew of it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.processes import GatewayProcess
from tests.servers import ServerProcess, free_port, wait_for

BLOCKS = "surge_gateway_kv_index_blocks"
PREFIXES = {
    "a": "You are the billing desk. Answer questions about invoices, refunds and plans. " * 4,
    "b": "You are the travel desk. Answer questions about trains, flights and hotels. " * 4,
}


def _replica(model: Path, port: int, events_port: int, replay: bool) -> ServerProcess:
    # One replica offers vLLM's replay socket (the gateway also reads what it published
    # before subscribing), the other does not (what the gateway missed stays missed).
    more = ("--kv-events-replay-endpoint", "tcp://127.0.0.1:*") if replay else ()
    return ServerProcess(
        model, "--dtype", "float32", "--num-kv-blocks", "48",
        "--kv-events-endpoint", f"tcp://127.0.0.1:{events_port}", *more, port=port,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path) -> Iterator[tuple[list[ServerProcess], list[int], GatewayProcess]]:
    ports = [free_port(), free_port()]
    events = [free_port(), free_port()]
    replicas = [
        _replica(tiny_model_dir, p, e, replay=i == 0)
        for i, (p, e) in enumerate(zip(ports, events, strict=True))
    ]
    gateway = GatewayProcess(
        "--policy", "kv_aware", "--kv-tokenizer", str(tiny_model_dir),
        "--scrape-interval", "0.2", *(a for r in replicas for a in ("--upstream", r.url)),
    )  # fmt: skip
    try:
        gateway.wait_ready(num_upstreams=2)
        yield replicas, events, gateway
    finally:
        gateway.stop()
        for r in replicas:
            r.stop()


def _gauge(gateway: GatewayProcess, name: str, **labels: str) -> float:
    return sum(gateway.samples(name, **labels))


def _chat(url: str, system: str, user: str) -> httpx.Response:
    body = {
        "model": "test-model",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 2,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r


def test_a_held_prefix_is_routed_to_its_holder_and_a_restart_drops_it(
    fleet: tuple[list[ServerProcess], list[int], GatewayProcess], tiny_model_dir: Path
) -> None:
    replicas, events, gateway = fleet
    for r in replicas:  # subscribed (the gauge shows up then)
        assert wait_for(lambda r=r: bool(gateway.samples(BLOCKS, upstream=r.url))), gateway.log()
    time.sleep(0.5)  # PUB/SUB: the connection itself takes a moment
    # Each replica gets one prefix straight (not through the gateway): only its events can
    # tell the gateway where each is held.
    for replica, system in zip(replicas, PREFIXES.values(), strict=True):
        _chat(replica.url, system, "hello")
    for r in replicas:
        assert wait_for(lambda r=r: _gauge(gateway, BLOCKS, upstream=r.url) >= 4), gateway.log()

    hits_before = [r.metric("vllm:prefix_cache_hits_total") for r in replicas]
    for i in range(3):
        for replica, system in zip(replicas, PREFIXES.values(), strict=True):
            served = _chat(gateway.url, system, f"question {i}").headers["x-surge-upstream"]
            assert served == replica.url
    after = [r.metric("vllm:prefix_cache_hits_total") for r in replicas]
    gained = [a - b for a, b in zip(after, hits_before, strict=True)]
    assert all(g >= 3 * 4 * 16 for g in gained), gained  # >= 4 blocks hit per request

    # Restart replica 0 (same ports): the connection goes, and its index with it.
    old = replicas[0]
    old.stop()
    drops = "surge_gateway_kv_index_drops_total"
    assert wait_for(lambda: _gauge(gateway, drops, upstream=old.url) >= 1), gateway.log()
    assert _gauge(gateway, BLOCKS, upstream=old.url) == 0
    replicas[0] = _replica(tiny_model_dir, old.port, events[0], replay=True)
    # Back, with an empty cache: what it held before is not believed again ...
    assert _gauge(gateway, BLOCKS, upstream=old.url) == 0
    assert _gauge(gateway, BLOCKS, upstream=replicas[1].url) >= 4  # ... the other's stays
    # ... and its new events are followed (the subscription reconnected by itself).
    _chat(replicas[0].url, PREFIXES["a"], "hello again")
    assert wait_for(lambda: _gauge(gateway, BLOCKS, upstream=old.url) >= 4), gateway.log()
