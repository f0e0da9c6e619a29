"""`surge autoscale` as a user runs it: a real gateway and real `surge serve` replicas (tiny
Llama) on 127.0.0.1, load through the official `openai` client, replicas started and drained by
the load, a killed replica replaced. Every process is stopped by its PID; every wait is bounded."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.servers import free_port, stop_process

pytestmark = pytest.mark.timeout(300)


class Autoscale:
    def __init__(self, model: Path, log_dir: Path, *flags: str, max_num_seqs: int = 2) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.log_path = log_dir / "autoscale.log"
        cmd = [
            sys.executable, "-m", "surge.cli", "autoscale", "--port", str(self.port),
            "--base-port", str(free_port()), "--metrics-port", str(self.metrics_port),
            "--log-dir", str(log_dir), "--interval", "0.5", "--reload-grace", "1",
            "--forecast-horizon", "0", *flags, "--",
            "--model", str(model), "--dtype", "float32", "--kv-cache-memory-gib", "0.1",
            "--max-num-seqs", str(max_num_seqs), "--served-model-name", "test-model",
        ]  # fmt: skip
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.wait_for(lambda: self._gateway_up(), 120, "the gateway")

    def _gateway_up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"autoscale exited early:\n{self.log()}")
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def metric(self, name: str, **labels: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return float(sample.value)
        return 0.0

    def ready(self) -> int:
        return int(self.metric("surge_autoscaler_replicas", state="ready"))

    def in_rotation(self) -> int:
        """Upstreams the gateway routes to (it re-reads the autoscaler's upstreams file)."""
        return int(httpx.get(self.url + "/health", timeout=5).json()["upstreams_in_rotation"])

    def replica_pids(self) -> list[int]:
        return [int(p) for p in re.findall(r"starting \(pid (\d+)\)", self.log())]

    def wait_for(self, check: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}:\n{self.log()}")

    def stop(self) -> int:
        code = stop_process(self.proc, 90)
        self._log.close()
        return code


@pytest.fixture
def autoscale_factory(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Autoscale]]:
    started: list[Autoscale] = []

    def make(*flags: str) -> Autoscale:
        a = Autoscale(tiny_model_dir, tmp_path, *flags)
        started.append(a)
        return a

    yield make
    for a in started:
        a.stop()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Load:
    """Completions through the gateway from `clients` concurrent clients on a thread of their
    own: one request each, or one after another until `until` is set. Each result is the
    upstream that answered (the gateway's x-surge-upstream header) or the exception."""

    def __init__(
        self, url: str, clients: int, max_tokens: int, until: threading.Event | None = None
    ) -> None:
        self.results: list[str | BaseException] = []
        self._until = until
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run(url, clients, max_tokens))
        )
        self._thread.start()

    async def _run(self, url: str, clients: int, max_tokens: int) -> None:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                    timeout=120)  # fmt: skip

        async def one(i: int) -> None:
            while True:
                try:
                    raw = await client.completions.with_raw_response.create(
                        model="test-model", prompt=f"request {i} of a surge",
                        max_tokens=max_tokens, extra_body={"ignore_eos": True},
                    )  # fmt: skip
                    out = raw.parse()
                    assert out.usage is not None and out.usage.completion_tokens == max_tokens
                    self.results.append(raw.headers["x-surge-upstream"])
                except Exception as e:
                    self.results.append(e)
                if self._until is None or self._until.is_set():
                    return

        async with client:
            await asyncio.gather(*(one(i) for i in range(clients)))

    def join(self, timeout_s: float) -> list[str | BaseException]:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "load did not finish"
        return self.results


def test_load_starts_a_replica_and_a_lull_drains_one_without_losing_a_request(
    autoscale_factory: Callable[..., Autoscale],
) -> None:
    a = autoscale_factory(
        "--min-replicas", "1", "--max-replicas", "2", "--target-ongoing", "2",
        "--scale-down-window", "3",
    )  # fmt: skip
    assert a.ready() == 1
    first = Load(a.url, clients=10, max_tokens=200)  # 10 ongoing against a target of 2 a replica
    a.wait_for(lambda: a.ready() == 2, 90, "a second replica")
    assert a.metric("surge_autoscaler_scale_events_total", direction="up") >= 1
    a.wait_for(lambda: a.in_rotation() == 2, 10, "the gateway to take the new replica")
    second = Load(a.url, clients=6, max_tokens=60)  # arrives with two replicas in rotation
    results = first.join(120) + second.join(120)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    (old,) = set(first.results)  # sent with one replica in rotation
    assert any(r != old for r in second.results), "the new replica took none of the new requests"
    # Two clients keep sending, one request after another: 2 ongoing against a target of 2 a
    # replica asks for one replica, so one drains while requests keep arriving (in a run with
    # a print here, 8 of 30 such requests were answered by the replica that drained). The
    # gateway stops routing to it before its SIGTERM; what it holds, it finishes.
    stop = threading.Event()
    trickle = Load(a.url, clients=2, max_tokens=30, until=stop)
    a.wait_for(lambda: a.ready() == 1 and a.metric("surge_autoscaler_replicas",
               state="draining") == 0, 60, "the scale-down")  # fmt: skip
    time.sleep(1.0)  # a few more requests on the one replica left
    stop.set()
    during = trickle.join(60)
    assert during and not [r for r in during if isinstance(r, BaseException)], during
    assert a.metric("surge_autoscaler_scale_events_total", direction="down") >= 1
    assert "stopped (exit 0)" in a.log()  # drained, not killed
    pids = a.replica_pids()
    assert a.stop() == 0
    assert pids and not any(_alive(p) for p in pids)


def test_a_replica_that_dies_is_replaced(autoscale_factory: Callable[..., Autoscale]) -> None:
    a = autoscale_factory("--min-replicas", "1", "--max-replicas", "1")
    (victim,) = a.replica_pids()
    os.kill(victim, signal.SIGKILL)  # a crash: no drain
    a.wait_for(lambda: len(a.replica_pids()) == 2 and a.ready() == 1, 90, "a replacement")
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="none", max_retries=2)
    out = client.completions.create(model="test-model", prompt="still there?", max_tokens=4,
                                    extra_body={"ignore_eos": True})  # fmt: skip
    assert out.usage is not None and out.usage.completion_tokens == 4
    assert "exited on its own" in a.log()


def test_scale_to_zero_and_back_on_a_request(autoscale_factory: Callable[..., Autoscale]) -> None:
    """min 0: no replica until a request comes; the gateway holds it (counted, which is what
    wakes the autoscaler) while one starts; idle again, the fleet drains to zero."""
    a = autoscale_factory("--min-replicas", "0", "--max-replicas", "1", "--scale-down-window", "3")
    health = httpx.get(a.url + "/health", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "scaled_to_zero"
    assert a.ready() == 0 and a.replica_pids() == []
    t0 = time.monotonic()
    first = Load(a.url, clients=2, max_tokens=8)  # both held until the replica is ready
    results = first.join(150)
    cold_s = time.monotonic() - t0
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len(results) == 2 and len(a.replica_pids()) == 1
    assert a.metric("surge_autoscaler_signal_replicas", signal="activation") == 1
    assert a.metric("surge_autoscaler_scale_events_total", direction="up") == 1
    # Idle: the last replica drains (exit 0) and the gateway is back to holding requests.
    a.wait_for(lambda: a.ready() == 0 and a.in_rotation() == 0, 60, "the scale to zero")
    a.wait_for(lambda: "stopped (exit 0)" in a.log(), 30, "the drain")
    assert not _alive(a.replica_pids()[0])
    # And back again: a request wakes a second replica.
    again = Load(a.url, clients=1, max_tokens=4).join(150)
    assert not [r for r in again if isinstance(r, BaseException)], again
    assert len(a.replica_pids()) == 2
    print(f"cold start through the gateway: {cold_s:.1f} s")
    assert a.stop() == 0
