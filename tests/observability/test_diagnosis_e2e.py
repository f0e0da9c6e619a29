"""Each bottleneck kind from a real `surge serve` of the tiny model driven into that state.

api_process is not driven here: on a shared 2-core test machine the HTTP process cannot be
made to hold a core while the engine idles without the load generator itself taking that core;
its rule is tested as a pure object in test_diagnosis.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.observability.load import Load, words
from tests.servers import ServerProcess

TIMEOUT_S = 90.0  # a kind shows within a window (10 s) of its load; 9x margin on a slow CPU


def wait_for(server: ServerProcess, kind: str, load: Load | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    seen: dict[str, Any] = {}
    while time.monotonic() < deadline:
        seen = httpx.get(server.url + "/v1/diagnosis", timeout=10).json()
        if seen["kind"] == kind:
            return seen
        time.sleep(0.3)
    statuses = dict(load.statuses) if load is not None else None
    raise AssertionError(f"no {kind} in {TIMEOUT_S}s: last {seen}, statuses {statuses}")


def bottleneck_gauge(server: ServerProcess) -> str:
    """The kind /metrics reads 1 for (exactly one)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=10).text
    ones = [
        s.labels["kind"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "surge:bottleneck" and s.value == 1.0
    ]
    assert len(ones) == 1, ones
    return ones[0]


@pytest.fixture(scope="module")
def small_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    # Two sequences, a 64-token budget, 8 queued at most: each limit is easy to reach.
    flags = ("--max-num-seqs", "2", "--max-num-batched-tokens", "64", "--max-queued-requests", "8")
    server = ServerProcess(tiny_model_dir, "--dtype", "float32", *flags)
    yield server
    server.stop()


def body(prompt_words: int, max_tokens: int) -> dict[str, Any]:
    return {"model": "test-model", "prompt": words(prompt_words), "max_tokens": max_tokens,
            "ignore_eos": True}  # fmt: skip


def test_idle_compute_prefill_admission_on_one_server(small_server: ServerProcess) -> None:
    s = small_server
    assert wait_for(s, "idle")["evidence"]["steps"] == 0
    assert bottleneck_gauge(s) == "idle"
    # Four long decodes on two sequence slots: steps full, two waiting, engine busy.
    with Load(s.url, 4, body(4, 100)) as load:
        found = wait_for(s, "compute", load)
    e = found["evidence"]
    assert e["seq_fill"] >= 0.9 and e["engine_busy"] >= 0.85 and e["waiting_mean"] >= 0.5
    assert "replicas" in found["action"]
    # Long prompts in 64-token chunks: the steps are prefill while requests wait.
    with Load(s.url, 4, body(400, 1), vary_prompt=True) as load:
        found = wait_for(s, "prefill", load)
        assert bottleneck_gauge(s) == "prefill"
    assert found["evidence"]["prefill_share"] >= 0.5
    # More clients than 2 running + 8 queued: 429s at the door.
    with Load(s.url, 24, body(4, 30)) as load:
        found = wait_for(s, "admission", load)
    assert load.statuses[429] > 0 and found["evidence"]["rejected"] > 0
    assert "bottleneck admission ->" in s.log() or "-> admission" in s.log()


def test_kv_memory_then_healthy(tiny_model_dir: Path) -> None:
    # 24 blocks of 16 tokens: two requests of ~130 prompt + 150 generated tokens cannot share it.
    s = ServerProcess(tiny_model_dir, "--dtype", "float32", "--num-kv-blocks", "24")
    try:
        # One request at a time, short: work, but no limit reached.
        with Load(s.url, 1, body(4, 8)) as load:
            wait_for(s, "healthy", load)
        with Load(s.url, 4, body(35, 150), vary_prompt=True) as load:
            found = wait_for(s, "kv_memory", load)
            assert bottleneck_gauge(s) == "kv_memory"
        e = found["evidence"]
        assert e["preemptions"] > 0 or e["blocked_on_kv"] > 0
        assert "KV" in found["action"]
    finally:
        s.stop()
