"""Upstream health: active /health probes plus passive outlier detection from real traffic.

HealthTracker is pure (clock passed in); probe_loop is the I/O shell that feeds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import httpx

from surge.gateway.config import HealthConfig

log = logging.getLogger(__name__)


class HealthTracker:
    """In or out of rotation, from probes and from the upstream's real traffic.

    Out: `unhealthy_threshold` probe failures in a row, or `outlier_failures` failed requests
    in a row. Back: `healthy_threshold` probe successes in a row counted from the moment it
    went out; without probes (interval 0), an outlier comes back after `eject_s`.
    """

    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self.healthy = True  # optimistic: the first probe runs as the gateway starts
        self.reason = ""  # why it is out: "probe" or "outlier"
        self._probe_successes = 0
        self._probe_failures = 0
        self._traffic_failures = 0
        self._ejected_at_s = 0.0

    @property
    def probing(self) -> bool:
        return self.config.interval_s > 0

    def is_healthy(self, now_s: float) -> bool:
        if (
            not self.healthy
            and not self.probing
            and now_s >= self._ejected_at_s + self.config.eject_s
        ):
            self._set(True, "", now_s)
        return self.healthy

    def on_probe(self, ok: bool, now_s: float) -> None:
        if ok:
            self._probe_successes += 1
            self._probe_failures = 0
            if not self.healthy and self._probe_successes >= self.config.healthy_threshold:
                self._set(True, "", now_s)
        else:
            self._probe_failures += 1
            self._probe_successes = 0
            if self.healthy and self._probe_failures >= self.config.unhealthy_threshold:
                self._set(False, "probe", now_s)

    def on_traffic(self, ok: bool, now_s: float) -> None:
        """A real request ended: ok, or failed as the upstream's fault (not 4xx, not 429)."""
        if ok:
            self._traffic_failures = 0
            return
        self._traffic_failures += 1
        if self.healthy and self._traffic_failures >= self.config.outlier_failures:
            self._set(False, "outlier", now_s)

    def _set(self, healthy: bool, reason: str, now_s: float) -> None:
        self.healthy = healthy
        self.reason = reason
        self._traffic_failures = 0
        if not healthy:
            self._ejected_at_s = now_s
            self._probe_successes = 0  # recovery needs fresh evidence


class Probed(Protocol):
    url: str
    health: HealthTracker


async def probe(client: httpx.AsyncClient, url: str, timeout_s: float) -> bool:
    """GET {url}/health: healthy iff it answers 200 in time."""
    try:
        r = await client.get(url + "/health", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


async def probe_loop(
    targets: Callable[[], Sequence[Probed]],
    client: httpx.AsyncClient,
    config: HealthConfig,
    clock: Callable[[], float],
) -> None:
    """Probe every upstream each interval, all at once, until cancelled."""
    while True:
        upstreams = list(targets())
        results = await asyncio.gather(*(probe(client, u.url, config.timeout_s) for u in upstreams))
        now_s = clock()
        for u, ok in zip(upstreams, results, strict=True):
            was_healthy = u.health.healthy
            u.health.on_probe(ok, now_s)
            if was_healthy != u.health.healthy:
                state = "back in rotation" if u.health.healthy else "out of rotation"
                log.warning("upstream %s %s (probe)", u.url, state)
        await asyncio.sleep(config.interval_s)
