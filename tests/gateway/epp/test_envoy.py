"""Surge's endpoint picker behind a real Envoy (1.40, the pinned wheel) in front of three real
`surge serve` replicas (tiny model), all on 127.0.0.1, the official openai client through it.

Two data planes, each with its own picker (`surge gateway --ext-proc-port`):
- A: ORIGINAL_DST + FULL_DUPLEX_STREAMED bodies (llm-d's standalone Envoy), failing closed: with
  one address per request and no host of its own, Envoy has nowhere to send a request the
  picker did not place, so it answers 503 at once rather than guess.
- B: override_host over the replicas with two fallbacks and retries, BUFFERED request bodies,
  failing open: Envoy's own least-request picks while the picker is away (the replicas protect
  themselves with their own admission control), and a dead primary is retried on the next
  endpoint of the list. (Failing open needs Envoy to hold the body: in FULL_DUPLEX_STREAMED
  mode it has handed it to the picker, and a picker that dies then fails the request.)

Tests run in file order: A's picker is killed (and restarted) after A's other tests, then B's,
and the replica kill comes last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.epp.envoy import EnvoyConfig, EnvoyProcess
from tests.gateway.processes import GatewayProcess
from tests.servers import ServerProcess, free_port

FAST = ("--health-interval", "0.5", "--health-timeout", "2", "--scrape-interval", "0.5")
UPSTREAM = "x-surge-upstream"


def endpoint(server: ServerProcess) -> str:
    return server.url.removeprefix("http://")


@dataclass
class Plane:
    picker_args: tuple[str, ...]
    picker: GatewayProcess
    envoy: EnvoyProcess
    envoy_config: EnvoyConfig

    def restart_picker(self) -> None:
        self.picker = GatewayProcess(*self.picker_args)
        self.picker.wait_ready(num_upstreams=3)

    def client(self, port: int | None = None) -> openai.OpenAI:
        url = f"http://127.0.0.1:{port}" if port else self.envoy.url
        return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=60)


@dataclass
class Fleet:
    servers: list[ServerProcess]
    a: Plane
    b: Plane
    dead_port: int  # nothing listens there: a subset naming only it has no ready endpoint


def _plane(servers: list[ServerProcess], extra: tuple[str, ...], envoy: EnvoyConfig) -> Plane:
    args = (*[a for s in servers for a in ("--upstream", s.url)], "--ext-proc-port",
            str(envoy.epp_port), *FAST, *extra)  # fmt: skip
    picker = GatewayProcess(*args)
    picker.wait_ready(num_upstreams=3)
    return Plane(args, picker, EnvoyProcess(envoy), envoy)


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path) -> Iterator[Fleet]:
    started: list[ServerProcess] = []
    planes: list[Plane] = []
    try:
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(ServerProcess, tiny_model_dir, "--dtype", "float32")
                       for _ in range(3)]  # fmt: skip
            started += [f.result() for f in futures]
        dead = free_port()
        subsets = {free_port(): [endpoint(started[1])], free_port(): [f"127.0.0.1:{dead}"]}
        envoy_a = EnvoyConfig(epp_port=free_port(), subsets=subsets, buffer_limit_bytes=32768)
        a = _plane(started, ("--objective", "batch=-1", "--objective", "chat=2",
                             "--max-in-flight-per-upstream", "1"), envoy_a)  # fmt: skip
        planes.append(a)
        b = _plane(started, ("--ext-proc-fallbacks", "2", "--breaker-failures", "2",
                             "--outlier-failures", "2"),
                   EnvoyConfig(epp_port=free_port(), cluster="override_host",
                               replicas=tuple(s.url for s in started), fail_open=True,
                               retries=2, request_body_mode="BUFFERED",
                               response_body_mode="NONE"))  # fmt: skip
        planes.append(b)
        yield Fleet(started, a, b, dead)
    finally:
        for p in planes:
            p.envoy.stop()
            p.picker.stop()
        for s in started:
            s.stop()


def served_counts(fleet: Fleet) -> list[float]:
    """Chat and completion requests each replica has answered (its own /metrics)."""
    out = []
    for s in fleet.servers:
        try:
            out.append(s.metric("vllm:e2e_request_latency_seconds_count"))
        except KeyError:
            out.append(0.0)
    return out


def test_grpc_health_answers_gies_service_names(fleet: Fleet) -> None:
    import grpc

    from surge.gateway.epp.proto import health_pb2 as hpb
    from surge.gateway.epp.proto import health_pb2_grpc as hpb_grpc

    serving = hpb.HealthCheckResponse.SERVING
    target = f"127.0.0.1:{fleet.a.envoy_config.epp_port}"
    with grpc.insecure_channel(target) as channel:
        stub = hpb_grpc.HealthStub(channel)
        for service in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            answer = stub.Check(hpb.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == serving, service
        with pytest.raises(grpc.RpcError) as e:
            stub.Check(hpb.HealthCheckRequest(service="no-such-service"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(hpb.HealthCheckRequest(service="readiness"), timeout=10)
        assert next(watch).status == serving
        watch.cancel()


def test_chat_json_and_stream_through_envoy(fleet: Fleet) -> None:
    client = fleet.a.client()
    raw = client.chat.completions.with_raw_response.create(
        model="test-model", messages=[{"role": "user", "content": "Hello there"}], max_tokens=8
    )
    chat = raw.parse()
    assert chat.choices[0].finish_reason in ("length", "stop") and chat.usage is not None
    assert raw.headers[UPSTREAM] in {endpoint(s) for s in fleet.servers}
    stream = client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "Count"}], max_tokens=16,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    text = fleet.a.picker.metrics()
    assert 'surge_epp_decisions_total{result="routed"}' in text


def test_client_cannot_pick_the_endpoint_and_prefix_routing_holds(fleet: Fleet) -> None:
    """A shared system prompt goes to one replica (the gateway's prefix policy, through the
    picker); a destination header the client sends is overwritten."""
    system = "You are a terse assistant for the support desk of a shop. " * 12
    before = served_counts(fleet)
    chosen = set()
    for i in range(4):
        r = httpx.post(fleet.a.envoy.url + "/v1/chat/completions", timeout=60,
                       headers={"x-gateway-destination-endpoint": f"127.0.0.1:{fleet.dead_port}"},
                       json={"model": "test-model", "max_tokens": 2, "messages": [
                           {"role": "system", "content": system},
                           {"role": "user", "content": f"question {i}"}]})  # fmt: skip
        assert r.status_code == 200, r.text
        chosen.add(r.headers[UPSTREAM])
    after = served_counts(fleet)
    assert len(chosen) == 1
    grew = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if y > x]
    assert [endpoint(fleet.servers[i]) for i in grew] == list(chosen)


def test_subset_hint_is_honoured_and_an_unready_subset_is_503(fleet: Fleet) -> None:
    only_second, only_dead = fleet.a.envoy.subset_ports
    client = fleet.a.client(only_second)
    for i in range(3):
        raw = client.completions.with_raw_response.create(
            model="test-model", prompt=f"subset {i}", max_tokens=2
        )
        assert raw.headers[UPSTREAM] == endpoint(fleet.servers[1])
    with pytest.raises(openai.InternalServerError) as e:
        fleet.a.client(only_dead).completions.create(model="test-model", prompt="x", max_tokens=2)
    assert e.value.status_code == 503
    assert e.value.body["code"] == "subset_empty"  # type: ignore[index]
    assert e.value.response.headers["retry-after"] == "1"


def test_saturated_pool_sheds_sheddable_requests_first(fleet: Fleet) -> None:
    """A's picker calls a replica saturated at one request in flight. With a long stream open
    on each, a sheddable request (objective `batch`, priority -1) gets 429 at once, while a
    `chat` one (priority 2) still goes through; once the streams close, `batch` goes too."""
    url = fleet.a.envoy.url + "/v1/completions"
    # Held open whatever the machine's speed: ~1 KiB per token (logprobs) that the client does
    # not read through a 4 KiB receive buffer and A's 32 KiB Envoy buffers, so the stream
    # cannot end until it is read or closed.
    body = {"model": "test-model", "prompt": "go on", "max_tokens": 1900, "ignore_eos": True,
            "stream": True, "logprobs": 5}  # fmt: skip
    window = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)]
    with httpx.Client(timeout=60, transport=httpx.HTTPTransport(socket_options=window)) as http:
        held, readers = [], []
        for _ in fleet.servers:
            r = http.send(http.build_request("POST", url, json=body), stream=True)
            assert r.status_code == 200, r.read()
            readers.append(r.iter_raw())  # kept: a dropped iterator would close the stream
            next(readers[-1])  # it runs: one in flight on its replica
            held.append(r)
        assert len({r.headers[UPSTREAM] for r in held}) == 3  # one each: all saturated
        ups = fleet.a.picker.health()["upstreams"]
        assert [u["in_flight"] for u in ups.values()] == [1, 1, 1], ups  # type: ignore[union-attr]
        small = {"model": "test-model", "prompt": "hi", "max_tokens": 2}
        shed = http.post(url, json=small, headers={"x-gateway-inference-objective": "batch"})
        assert shed.status_code == 429, shed.text
        assert shed.json()["error"]["code"] == "sheddable_shed"
        assert int(shed.headers["retry-after"]) >= 1
        kept = http.post(url, json=small, headers={"x-gateway-inference-objective": "chat"})
        assert kept.status_code == 200, kept.text
        for r in held:
            r.close()
    deadline = time.monotonic() + 20
    while True:  # the closed streams leave the picker's count as their ext_proc streams end
        late = httpx.post(url, json=small, timeout=60,
                          headers={"x-gateway-inference-objective": "batch"})  # fmt: skip
        if late.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert late.status_code == 200, late.text


def test_picker_death_fails_closed_on_original_dst(fleet: Fleet) -> None:
    os.kill(fleet.a.picker.proc.pid, signal.SIGKILL)
    fleet.a.picker.proc.wait(10)
    started = time.monotonic()
    r = httpx.post(fleet.a.envoy.url + "/v1/completions", timeout=30,
                   json={"model": "test-model", "prompt": "x", "max_tokens": 2})  # fmt: skip
    assert r.status_code == 503 and time.monotonic() - started < 5  # at once, not a hang
    fleet.a.restart_picker()
    deadline = time.monotonic() + 20
    while True:  # Envoy reconnects to the new picker
        r = httpx.post(fleet.a.envoy.url + "/v1/completions", timeout=30,
                       json={"model": "test-model", "prompt": "x", "max_tokens": 2})  # fmt: skip
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200, r.text


def test_picker_death_fails_open_on_override_host(fleet: Fleet) -> None:
    client = fleet.b.client()
    raw = client.completions.with_raw_response.create(model="test-model", prompt="a", max_tokens=2)
    assert raw.headers[UPSTREAM]  # the picker placed it
    os.kill(fleet.b.picker.proc.pid, signal.SIGKILL)
    fleet.b.picker.proc.wait(10)
    for i in range(6):  # Envoy's least-request places them: all served
        out = client.completions.create(model="test-model", prompt=f"open {i}", max_tokens=2)
        assert out.choices[0].text is not None
    fleet.b.restart_picker()


@pytest.mark.long
async def test_kill_9_of_one_replica_under_load_through_envoy(fleet: Fleet) -> None:
    """120 requests through B, 12 at a time, half streamed; the replica holding a long JSON
    request is killed -9 after 20 have finished. Every JSON request succeeds, the long one
    included: Envoy retries a dead primary on the picker's next fallback. A stream whose first
    bytes had come from the victim cannot go on elsewhere through Envoy (the picker does not
    relay bodies to resume them, unlike the HTTP gateway): it may end early, and only those."""
    url = fleet.b.envoy.url + "/v1/completions"
    num_done, killed = 0, asyncio.Event()
    gate = asyncio.Semaphore(12)
    victim: ServerProcess | None = None
    results: list[tuple[int, bool, bool, str]] = []  # status, stream, complete, served

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal num_done
        stream = i % 2 == 0
        body = {"model": "test-model", "prompt": f"request {i}", "max_tokens": 24,
                "ignore_eos": True, "stream": stream}  # fmt: skip
        async with gate, client.stream("POST", url, json=body) as r:
            served, text = r.headers.get(UPSTREAM, ""), ""
            with contextlib.suppress(httpx.HTTPError):  # a stream cut: its replica died
                text = (await r.aread()).decode()
        num_done += 1
        if num_done == 20:
            assert victim is not None and not held.done(), "the long request ended before"
            os.kill(victim.proc.pid, signal.SIGKILL)
            killed.set()
        if stream:
            complete = text.rstrip().endswith("data: [DONE]")
        else:
            complete = r.status_code == 200 and json.loads(text)["usage"]["completion_tokens"] == 24
        results.append((r.status_code, stream, complete, served))

    long_body = {"model": "test-model", "prompt": "hold on", "max_tokens": 1000,
                 "ignore_eos": True}  # fmt: skip
    async with httpx.AsyncClient(timeout=300) as client:  # a loaded 2-core machine is slow
        held = asyncio.create_task(client.post(url, json=long_body))
        victim = await _holder(fleet)
        await asyncio.gather(*(one(client, i) for i in range(120)))
        long = await held
    assert killed.is_set()
    assert long.status_code == 200 and long.headers[UPSTREAM] != endpoint(victim)
    assert long.json()["usage"]["completion_tokens"] == 1000  # run again on a fallback
    failed = [r for r in results if not r[2]]
    assert [r for r in failed if not r[1]] == []  # every JSON request succeeded
    assert all(served == endpoint(victim) for _, _, _, served in failed), failed
    health = fleet.b.picker.health()
    assert health["upstreams"][victim.url]["healthy"] is False  # type: ignore[index]


async def _holder(fleet: Fleet) -> ServerProcess:
    """The replica B's picker has a request in flight on (it has only the one)."""
    deadline = time.monotonic() + 30
    while True:
        health = await asyncio.to_thread(fleet.b.picker.health)
        ups: dict[str, dict[str, int]] = health["upstreams"]  # type: ignore[assignment]
        busy = [url for url, u in ups.items() if u["in_flight"]]
        if busy:
            return next(s for s in fleet.servers if s.url == busy[0])
        assert time.monotonic() < deadline, health
        await asyncio.sleep(0.02)
