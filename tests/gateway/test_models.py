"""Model-aware routing: `surge gateway` sends a request only to upstreams whose /v1/models
lists its `model` (base models and LoRA adapters, scraped), lists the union itself, and answers
404 for a model no upstream serves; real `surge serve` processes (tiny model, a PEFT adapter
on one of them, then loaded on the other at run time)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway.processes import GatewayProcess
from tests.lora_adapters import write_peft_adapter
from tests.servers import ServerProcess

FAST = ("--health-interval", "0.5", "--health-timeout", "2", "--scrape-interval", "0.3")


@dataclass
class Pair:
    with_lora: ServerProcess  # serves adapter "sql" from the start
    plain: ServerProcess  # may load it at run time
    gateway: GatewayProcess  # round robin over both
    adapter: Path


@pytest.fixture(scope="module")
def pair(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    adapter = write_peft_adapter(tiny_model_dir, tmp_path_factory.mktemp("gw-lora") / "sql")
    started: list[ServerProcess | GatewayProcess] = []
    try:
        with ThreadPoolExecutor(2) as pool:
            a = pool.submit(ServerProcess, tiny_model_dir, "--dtype", "float32",
                            "--lora-modules", f"sql={adapter}")  # fmt: skip
            b = pool.submit(ServerProcess, tiny_model_dir, "--dtype", "float32", "--enable-lora",
                            "--allow-runtime-lora-updating")  # fmt: skip
            with_lora, plain = a.result(), b.result()
        started += [with_lora, plain]
        gateway = GatewayProcess("--upstream", with_lora.url, "--upstream", plain.url,
                                 "--policy", "round_robin", *FAST)  # fmt: skip
        started.append(gateway)
        gateway.wait_ready(num_upstreams=2)
        _wait_models(gateway, {"test-model": 2, "sql": 1})
        yield Pair(with_lora, plain, gateway, adapter)
    finally:
        for p in reversed(started):
            p.stop()


def _models(gateway: GatewayProcess) -> dict[str, int]:
    body = httpx.get(gateway.url + "/v1/models", timeout=5).json()
    return {m["id"]: m.get("upstreams", 0) for m in body["data"]}


def _wait_models(gateway: GatewayProcess, want: dict[str, int], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while _models(gateway) != want:
        assert time.monotonic() < deadline, f"gateway models {_models(gateway)}, want {want}"
        time.sleep(0.1)


def _upstreams(gateway: GatewayProcess, model: str, n: int) -> Counter[str]:
    """Where n completions for `model` went (the gateway's x-surge-upstream header)."""
    seen: Counter[str] = Counter()
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)
    for _ in range(n):
        raw = client.completions.with_raw_response.create(
            model=model, prompt="SELECT", max_tokens=2, temperature=0.0
        )
        assert raw.parse().model == model
        seen[raw.headers["x-surge-upstream"]] += 1
    return seen


def test_adapter_requests_go_where_it_is_loaded(pair: Pair) -> None:
    assert _upstreams(pair.gateway, "sql", 6) == Counter({pair.with_lora.url: 6})
    base = _upstreams(pair.gateway, "test-model", 6)
    assert base == Counter({pair.with_lora.url: 3, pair.plain.url: 3})  # round robin, both


def test_unknown_model_is_a_404_from_the_gateway(pair: Pair) -> None:
    client = openai.OpenAI(base_url=pair.gateway.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert err.value.code == "model_not_found"
    assert "x-surge-upstream" not in err.value.response.headers  # no upstream was tried


def test_a_run_time_load_joins_the_rotation(pair: Pair) -> None:
    body = {"lora_name": "sql", "lora_path": str(pair.adapter)}
    r = httpx.post(pair.plain.url + "/v1/load_lora_adapter", json=body, timeout=30)
    assert r.status_code == 200, r.text
    _wait_models(pair.gateway, {"test-model": 2, "sql": 2})
    seen = _upstreams(pair.gateway, "sql", 6)
    assert seen == Counter({pair.with_lora.url: 3, pair.plain.url: 3})
    r = httpx.post(pair.plain.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"},
                   timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    _wait_models(pair.gateway, {"test-model": 2, "sql": 1})
    assert _upstreams(pair.gateway, "sql", 4) == Counter({pair.with_lora.url: 4})


def test_a_stale_list_is_retried_where_the_model_is(pair: Pair) -> None:
    """An adapter unloaded since the gateway's last look (a scrape a minute apart): the upstream
    answers 404 model_not_found, and the request is retried on one that still serves it."""
    body = {"lora_name": "sql", "lora_path": str(pair.adapter)}
    r = httpx.post(pair.plain.url + "/v1/load_lora_adapter", json=body, timeout=30)
    assert r.status_code == 200, r.text
    slow = GatewayProcess("--upstream", pair.with_lora.url, "--upstream", pair.plain.url,
                          "--policy", "round_robin", "--health-interval", "0.5",
                          "--scrape-interval", "60")  # fmt: skip
    try:
        slow.wait_ready(num_upstreams=2)
        _wait_models(slow, {"test-model": 2, "sql": 2})  # the first scrape: both list it
        r = httpx.post(pair.plain.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"},
                       timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        # Round robin would send every other request to the upstream that unloaded it.
        assert _upstreams(slow, "sql", 4) == Counter({pair.with_lora.url: 4})
        assert 'surge_gateway_retries_total{reason="model_not_found"} 1.0' in slow.metrics()
    finally:
        slow.stop()
