"""A real `surge serve` publishes its prefix cache's KV events (vLLM's ZMQ format): a real
subscriber sees BlockStored with the very hashes the gateway computes for the same request,
BlockRemoved when a small KV cache evicts them, and the replay socket resends from seq 0."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq

from surge.gateway.kv_tokens import prompt_tokens
from surge.kv_events.hashing import HASH_SCHEME, block_hashes
from surge.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    parse_seq,
    seq_bytes,
)
from tests.servers import ServerProcess, free_port

SYSTEM = "You are a careful assistant who answers in short sentences. " * 4


@pytest.fixture(scope="module")
def replica(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(
        tiny_model_dir, "--dtype", "float32", "--num-kv-blocks", "16",
        "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}",
        "--kv-events-replay-endpoint", "tcp://127.0.0.1:*",
    )  # fmt: skip
    yield server
    server.stop()


@pytest.fixture()
def subscriber(replica: ServerProcess) -> Iterator[zmq.Socket]:
    info = httpx.get(replica.url + "/version", timeout=5).json()["kv_events"]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, info["topic"].encode())
    sock.connect(info["endpoint"])
    time.sleep(0.5)  # PUB/SUB joins late: what is sent before the connection is lost
    yield sock
    ctx.destroy(linger=0)


def _drain(sock: zmq.Socket, until: Any, timeout_s: float = 20.0) -> list[KVEventBatch]:
    """Batches received until `until(batches)` holds (or the time is up)."""
    got: list[KVEventBatch] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not until(got):
        if sock.poll(200):
            _topic, seq, payload = sock.recv_multipart()
            parse_seq(seq)
            got.append(decode_batch(payload))
    return got


def _events(batches: list[KVEventBatch], kind: type) -> list[Any]:
    return [e for b in batches for e in b.events if isinstance(e, kind)]


def _chat(replica: ServerProcess, user: str) -> dict[str, Any]:
    body = {
        "model": "test-model",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 3,
    }
    r = httpx.post(replica.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return body


def test_version_advertises_the_bound_endpoints(replica: ServerProcess) -> None:
    info = httpx.get(replica.url + "/version", timeout=5).json()["kv_events"]
    assert info["endpoint"].startswith("tcp://127.0.0.1:")
    assert not info["replay_endpoint"].endswith(":*")  # the port it really bound
    assert (info["block_size"], info["hash"]) == (16, HASH_SCHEME)


def test_stored_hashes_match_the_gateways_and_eviction_removes_them(
    replica: ServerProcess, subscriber: zmq.Socket, tiny_model_dir: Path
) -> None:
    body = _chat(replica, "What is the capital of France?")
    tokens = prompt_tokens(body, str(tiny_model_dir), 10_000)
    assert tokens is not None
    expected = block_hashes(tokens.token_ids, 16)
    assert len(expected) >= 3

    def all_stored(batches: list[KVEventBatch]) -> bool:
        stored = {h for e in _events(batches, BlockStored) for h in e.block_hashes}
        return set(expected) <= stored

    batches = _drain(subscriber, all_stored)
    assert all_stored(batches), "the engine stored other hashes than the gateway computes"
    first = next(e for e in _events(batches, BlockStored) if e.block_hashes[0] == expected[0])
    assert first.parent_block_hash is None and first.block_size == 16
    assert first.token_ids[:16] == list(tokens.token_ids[:16])
    assert first.medium == "CPU"

    # 16 blocks of 16 tokens: a few other long prompts must evict the first one's blocks.
    for i in range(5):
        r = httpx.post(
            replica.url + "/v1/completions",
            json={"model": "test-model", "prompt": f"{i} other words {i} " * 25, "max_tokens": 2},
            timeout=60,
        )
        assert r.status_code == 200, r.text

    def removed(batches: list[KVEventBatch]) -> bool:
        gone = {h for e in _events(batches, BlockRemoved) for h in e.block_hashes}
        return set(expected) <= gone

    assert removed(_drain(subscriber, removed)), "no BlockRemoved for the evicted blocks"


def test_replay_resends_from_the_first_batch(replica: ServerProcess) -> None:
    _chat(replica, "Say something.")
    info = httpx.get(replica.url + "/version", timeout=5).json()["kv_events"]
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(info["replay_endpoint"])
        dealer.send_multipart([b"", seq_bytes(0)])
        seqs, first = [], None
        while dealer.poll(5000):
            frames = dealer.recv_multipart()
            seq = parse_seq(frames[-2])
            if seq < 0:
                break
            seqs.append(seq)
            first = first or decode_batch(frames[-1])
        assert seqs[:1] == [0] and seqs == list(range(len(seqs))), seqs
        assert first is not None and first.events == [AllBlocksCleared()]  # a fresh start
    finally:
        ctx.destroy(linger=0)


def test_a_taken_endpoint_fails_the_start_in_one_line(tiny_model_dir: Path) -> None:
    taken = zmq.Context()
    sock = taken.socket(zmq.PUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(RuntimeError, match=f"kv-events-endpoint tcp://127.0.0.1:{port}"):
            ServerProcess(tiny_model_dir, "--dtype", "float32", "--num-kv-blocks", "16",
                          "--kv-events-endpoint", f"tcp://127.0.0.1:{port}")  # fmt: skip
    finally:
        taken.destroy(linger=0)
