"""Replicas another system starts and stops (Kubernetes, through KEDA or an HPA): found by DNS
(a headless Service) and/or listed, scraped like any others, never started or drained here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from surge.autoscale.providers.base import Replica, ReplicaStartError, ReplicaState
from surge.http.discovery import DnsTarget, resolve

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ObservedConfig:
    discover: DnsTarget | None = None  # re-resolved before every decision
    upstreams: tuple[str, ...] = ()  # fixed URLs, e.g. http://10.0.0.7:8000

    def __post_init__(self) -> None:
        if self.discover is None and not self.upstreams:
            raise ValueError("observe mode needs --discover dns://NAME:PORT or --upstream URL")


class ObservedProvider:
    """The Provider protocol for a fleet this process only watches: every replica found is
    READY (a headless Service lists only pods whose readiness probe passes)."""

    def __init__(
        self,
        config: ObservedConfig,
        resolver: Callable[[DnsTarget], tuple[str, ...]] = resolve,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._resolve = resolver
        self._clock = clock
        self._replicas: dict[str, Replica] = {}

    async def refresh(self) -> None:
        urls = set(self.config.upstreams)
        if self.config.discover is not None:
            try:
                urls |= set(await asyncio.to_thread(self._resolve, self.config.discover))
            except OSError as e:  # DNS did not answer: keep the replicas known until it does
                log.warning(
                    "DNS discovery failed (keeping %d replicas): %s", len(self._replicas), e
                )
                return
        now_s = self._clock()
        self._replicas = {
            url: self._replicas.get(url) or Replica(url, url, ReplicaState.READY, now_s)
            for url in sorted(urls)
        }

    async def start(self) -> Replica:
        raise ReplicaStartError("observe mode: the cluster starts replicas, not this process")

    async def drain(self, replica: Replica, timeout_s: float) -> None:
        return None  # the cluster drains its pods (SIGTERM, then the grace period)

    def alive(self, replica: Replica) -> bool:
        return True  # one that is gone drops out of the next resolve

    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    async def close(self, timeout_s: float) -> None:
        return None
