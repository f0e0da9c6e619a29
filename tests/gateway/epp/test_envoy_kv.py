"""The endpoint picker with `--policy kv_aware` behind a real Envoy (the pinned wheel's, an
ORIGINAL_DST cluster, FULL_DUPLEX_STREAMED bodies) in front of three real `surge serve`
replicas (tiny model) that publish their prefix caches' KV events: a prompt whose prefix one
replica holds goes to that replica, streamed or not, and the replica's own prefix-cache hits
show the blocks were reused there.

Each replica first gets its own system prompt straight (not through Envoy): only its events
can tell the picker where each prefix is, so a right pick is the events' doing, not a memory
of earlier picks."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.epp.envoy import EnvoyConfig, EnvoyProcess
from tests.gateway.processes import GatewayProcess
from tests.servers import ServerProcess, free_port, wait_for

UPSTREAM = "x-surge-upstream"
BLOCKS = "surge_gateway_kv_index_blocks"
HITS = "vllm:prefix_cache_hits_total"
DESKS = ("billing: invoices, refunds and plans", "travel: trains, flights and hotels",
         "hardware: laptops, screens and cables", "garden: seeds, tools and soil")  # fmt: skip
# ~130 tokens each: 8 full blocks of 16, distinct from the first block on
PREFIXES = [f"You are the {d} desk. Answer briefly and politely, then stop. " * 6 for d in DESKS]
# Three replicas and an Envoy per module: make test-long runs it (make test is at its budget).
pytestmark = pytest.mark.long


@dataclass
class Fleet:
    servers: list[ServerProcess]
    picker: GatewayProcess
    envoy: EnvoyProcess

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.envoy.url + "/v1", api_key="sk-test", max_retries=0, timeout=60
        )


def endpoint(server: ServerProcess) -> str:
    return server.url.removeprefix("http://")


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path) -> Iterator[Fleet]:
    servers: list[ServerProcess] = []
    picker: GatewayProcess | None = None
    envoy: EnvoyProcess | None = None
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = [
                pool.submit(ServerProcess, tiny_model_dir, "--dtype", "float32",
                            "--num-kv-blocks", "64", "--kv-events-endpoint", "tcp://127.0.0.1:*")
                for _ in range(3)
            ]  # fmt: skip
            servers += [f.result() for f in futures]
        epp_port = free_port()
        picker = GatewayProcess(
            *[a for s in servers for a in ("--upstream", s.url)], "--ext-proc-port",
            str(epp_port), "--policy", "kv_aware", "--kv-tokenizer", str(tiny_model_dir),
            "--health-interval", "0.5", "--scrape-interval", "0.2",
        )  # fmt: skip
        picker.wait_ready(num_upstreams=3)
        envoy = EnvoyProcess(EnvoyConfig(epp_port=epp_port))
        yield Fleet(servers, picker, envoy)
    finally:
        if envoy is not None:
            envoy.stop()
        if picker is not None:
            picker.stop()
        for s in servers:
            s.stop()


def _index_blocks(picker: GatewayProcess, url: str) -> float | None:
    """The picker's count of blocks `url` reports holding; None before it subscribed."""
    values = picker.samples(BLOCKS, upstream=url)
    return values[0] if values else None


def _has_blocks(picker: GatewayProcess, url: str, at_least: float) -> bool:
    """The picker is subscribed to `url` and counts at least this many blocks there."""
    n = _index_blocks(picker, url)
    return n is not None and n >= at_least


def _messages(system: str, user: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _chat(client: openai.OpenAI, system: str, user: str, stream: bool) -> str:
    """One chat turn through Envoy; the endpoint that served it."""
    if not stream:
        raw = client.chat.completions.with_raw_response.create(
            model="test-model",
            messages=_messages(system, user),
            max_tokens=2,
        )
        assert raw.parse().choices[0].finish_reason in ("length", "stop")
        return raw.headers[UPSTREAM]
    raw_stream = client.chat.completions.with_raw_response.create(
        model="test-model", messages=_messages(system, user), max_tokens=4,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(raw_stream.parse())
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    return raw_stream.headers[UPSTREAM]


def test_a_prefix_one_replica_holds_goes_there_streamed_or_not(fleet: Fleet) -> None:
    servers, picker = fleet.servers, fleet.picker
    for s in servers:  # subscribed to each (the gauge appears then), the connection settled
        assert wait_for(functools.partial(_has_blocks, picker, s.url, 0)), picker.log()
    time.sleep(0.5)
    for s, system in zip(servers, PREFIXES, strict=False):  # straight to the replica
        body = {"model": "test-model", "messages": _messages(system, "hello"), "max_tokens": 2}
        r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    for s in servers:
        assert wait_for(functools.partial(_has_blocks, picker, s.url, 8)), picker.log()

    client = fleet.client()
    hits = [s.metric(HITS) for s in servers]
    for i in range(2):
        for s, system in zip(servers, PREFIXES, strict=False):
            for stream in (False, True):
                served = _chat(client, system, f"question {i} {stream}", stream)
                assert served == endpoint(s), (i, stream, served, picker.log())
    gained = [s.metric(HITS) - h for s, h in zip(servers, hits, strict=True)]
    assert all(g >= 4 * 8 * 16 for g in gained), gained  # each of 4 requests: >= 8 blocks hit


def test_a_new_prefix_is_followed_to_where_it_went_first(fleet: Fleet) -> None:
    """A prefix nobody held goes somewhere; its blocks' events come back from there, and the
    same prefix again goes to the same replica and hits its cache."""
    client = fleet.client()
    by_endpoint = {endpoint(s): s for s in fleet.servers}
    system = PREFIXES[3]
    held = {s.url: _index_blocks(fleet.picker, s.url) or 0 for s in fleet.servers}
    first = _chat(client, system, "a first question", stream=True)
    holder = by_endpoint[first]
    more = functools.partial(_has_blocks, fleet.picker, holder.url, held[holder.url] + 8)
    assert wait_for(more), fleet.picker.log()
    before = holder.metric(HITS)
    for i in range(3):
        assert _chat(client, system, f"follow-up {i}", stream=i % 2 == 0) == first
    assert holder.metric(HITS) - before >= 3 * 8 * 16
