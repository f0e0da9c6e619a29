"""What the autoscaler reads from each replica's /metrics, and the fleet-wide signals from it.

Gauges are summed over replicas; counters (requests received, latency sums) become rates from
one scrape to the next per replica, so a replica that comes or goes never shows as a jump.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from surge.observability.scan import scan_metrics

# metric name -> ReplicaLoad field
_METRICS = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "surge:requests_received_total": "received",
    "vllm:e2e_request_latency_seconds_sum": "latency_sum",
    "vllm:e2e_request_latency_seconds_count": "latency_count",
}


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    url: str
    ok: bool  # the scrape answered 200
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    received: float = 0.0  # counter
    latency_sum: float = 0.0  # counter: seconds of finished requests
    latency_count: float = 0.0  # counter: finished requests


def parse_metrics(url: str, text: str) -> ReplicaLoad:
    return ReplicaLoad(url, True, **scan_metrics(text, _METRICS, keep_max=("kv_usage",)))


async def scrape(client: httpx.AsyncClient, url: str, timeout_s: float) -> ReplicaLoad:
    try:
        r = await client.get(url + "/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return ReplicaLoad(url, False)
    return parse_metrics(url, r.text) if r.status_code == 200 else ReplicaLoad(url, False)


async def scrape_all(
    client: httpx.AsyncClient, urls: Sequence[str], timeout_s: float
) -> list[ReplicaLoad]:
    return list(await asyncio.gather(*(scrape(client, u, timeout_s) for u in urls)))


@dataclass(frozen=True, slots=True)
class Signals:
    replicas: int  # ready replicas that answered the scrape
    waiting: float  # requests waiting, all replicas
    running: float
    kv_usage: float  # mean over replicas
    arrival_rps: float | None  # requests received per second, all replicas; None: no rate yet
    mean_latency_s: float | None  # of requests finished lately; None: none finished yet

    @property
    def ongoing(self) -> float:
        return self.waiting + self.running


class SignalTracker:
    """Turns scrapes into Signals, keeping each replica's previous counters for its rates."""

    def __init__(self) -> None:
        self._previous: dict[str, tuple[float, ReplicaLoad]] = {}
        self._latency_s: float | None = None

    def update(self, now_s: float, loads: Sequence[ReplicaLoad]) -> Signals:
        ok = [x for x in loads if x.ok]
        rate: float | None = None
        latency_sum = latency_count = 0.0
        for load in ok:
            before = self._previous.get(load.url)
            if before is None:
                continue
            then_s, old = before
            dt = now_s - then_s
            received = load.received - old.received
            if dt <= 0 or received < 0:  # a restarted replica's counters begin again
                continue
            rate = (rate or 0.0) + received / dt
            latency_sum += max(0.0, load.latency_sum - old.latency_sum)
            latency_count += max(0.0, load.latency_count - old.latency_count)
        if latency_count > 0:
            self._latency_s = latency_sum / latency_count
        self._previous = {x.url: (now_s, x) for x in ok}
        return Signals(
            replicas=len(ok),
            waiting=sum(x.waiting for x in ok),
            running=sum(x.running for x in ok),
            kv_usage=sum(x.kv_usage for x in ok) / len(ok) if ok else 0.0,
            arrival_rps=rate,
            mean_latency_s=self._latency_s,
        )
