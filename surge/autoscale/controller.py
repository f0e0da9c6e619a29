"""The control loop: scrape the ready replicas, decide, stabilize, then start or drain replicas
through the provider, and publish the ready set to the gateway's upstreams file.

Starting and draining run as tasks of their own, so the loop keeps scraping while a replica
loads its model. A replica counts toward the fleet from the moment it is asked for (else every
tick of a slow start would ask for another). A replica leaves the upstreams file before its
drain starts, so the gateway stops sending it requests; the server then finishes what it holds
(`surge serve` drains on SIGTERM), and anything the gateway still sent it meanwhile gets a 503
the gateway retries elsewhere: nothing accepted is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.decide import BatchJudge, Decision, Stabilizer, desired_replicas
from surge.autoscale.forecast_bank import ForecastBank
from surge.autoscale.providers.base import Provider, Replica, ReplicaStartError, ReplicaState
from surge.autoscale.signals import SignalTracker, scrape, scrape_all
from surge.observability.autoscaler_metrics import AutoscalerMetrics
from surge.observability.scan import scan_metrics

AWAITING = "surge_gateway_requests_awaiting_upstream"  # the gateway's gauge
log = logging.getLogger(__name__)


def write_upstreams_file(path: Path, urls: list[str]) -> None:
    """The gateway's upstreams file, replaced atomically (it may read at any moment)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump({"upstreams": urls}, f)
    os.replace(tmp, path)


class Autoscaler:
    def __init__(
        self,
        config: AutoscalerConfig,
        provider: Provider,
        upstreams_file: Path | None = None,
        metrics: AutoscalerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.provider = provider
        self.upstreams_file = upstreams_file
        self.metrics = metrics
        self.clock = clock
        self.tracker = SignalTracker()
        self.forecasts = ForecastBank(config)
        self.stabilizer = Stabilizer(config)
        self.batch = BatchJudge(config)
        self.pending_starts = 0  # asked for, not yet ready
        self.gateway_url: str | None = None  # scaled to zero, its waiting requests wake us
        self._tasks: set[asyncio.Task[None]] = set()
        self._published: list[str] | None = None
        # Observe mode (Kubernetes): decide, but leave starting and draining to the cluster.
        self.act = True
        # Told every decision: (replicas decided on, requests waiting or held); KEDA's answers.
        self.on_decision: Callable[[int, float], None] | None = None
        self._last_target = 0

    # -- the fleet -------------------------------------------------------------------------

    def ready(self) -> list[Replica]:
        return [r for r in self.provider.replicas() if r.state is ReplicaState.READY]

    @property
    def current(self) -> int:
        """What the fleet will be: ready replicas plus those starting."""
        return len(self.ready()) + self.pending_starts

    def publish(self) -> None:
        """The ready set to the gateway's upstreams file (when it changed) and the gauges."""
        if self.metrics is not None:
            self.metrics.set_fleet(len(self.ready()), self.pending_starts, self.draining())
        urls = sorted(r.url for r in self.ready())
        if self.upstreams_file is not None and urls != self._published:
            write_upstreams_file(self.upstreams_file, urls)
            log.info("upstreams: %s", urls)
        self._published = urls

    async def start_initial(self) -> None:
        """Bring the fleet to its initial size before serving (the gateway needs an upstream)."""
        await asyncio.gather(*(self._start_one() for _ in range(self.config.start_replicas)))
        self.publish()
        if self.config.start_replicas and not self.ready():
            raise ReplicaStartError("no replica could be started; see the replica logs")

    async def _start_one(self) -> None:
        self.pending_starts += 1
        try:
            await self.provider.start()
            self.stabilizer.note(self.clock(), len(self.ready()))
        except ReplicaStartError as e:
            log.error("%s", e)
        finally:
            self.pending_starts -= 1
            self.publish()

    async def _drain_one(self, replica: Replica) -> None:
        replica.state = ReplicaState.DRAINING
        self.publish()  # out of the gateway's rotation first
        await asyncio.sleep(self.config.reload_grace_s)
        await self.provider.drain(replica, self.config.drain_timeout_s)
        self.publish()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one decision ------------------------------------------------------------------------

    async def step(self, client: httpx.AsyncClient) -> int:
        """Scrape, decide, act; returns the replica count decided on."""
        await self.provider.refresh()
        self._replace_dead()
        ready = self.ready()
        loads = await scrape_all(client, [r.url for r in ready], self.config.scrape_timeout_s)
        gateway = None  # its batches (fleet-wide ones run there, their lines on the replicas)
        if self.gateway_url is not None:
            gateway = await scrape(client, self.gateway_url, self.config.scrape_timeout_s)
        now = self.clock()
        signals = self.tracker.update(now, loads, gateway)
        forecast = self.forecasts.update(now, signals.arrival_rps)
        current = self.current
        awaiting = 0.0
        if current == 0:
            # No replica (scaled to zero, or the last one died): the floor, or requests held by
            # the gateway, ask for one at once; there is no replica to scrape.
            awaiting = 0.0
            if self.config.min_replicas == 0:
                timeout_s = self.config.scrape_timeout_s
                awaiting = await scrape_awaiting(client, self.gateway_url, timeout_s)
            # A batch at no replica never finishes: it would miss its window, so it wakes one.
            lines = signals.batch.remaining
            wanted = int(awaiting > 0 or lines > 0)
            decision = Decision(
                max(self.config.min_replicas, wanted),
                f"activation: {awaiting:g} awaiting at the gateway, {lines:g} batch lines",
                {"activation": wanted},
            )
            target = decision.desired
        else:
            batch = self.batch.want(now, signals)
            decision = desired_replicas(signals, self.config, forecast, current, batch)
            target = self.stabilizer.recommend(now, decision.desired, current)
        if self.on_decision is not None:
            self.on_decision(target, signals.waiting + awaiting)
        if not self.act:
            pass  # observe mode: the cluster (KEDA/HPA) starts and drains, to `target`
        elif target > current:
            log.info("scale up %d -> %d (%s)", current, target, decision.reason)
            for _ in range(target - current):
                self._spawn(self._start_one())
        elif target < current and self.pending_starts == 0:
            load = {x.url: x.waiting + x.running for x in loads if x.ok}
            victims = pick_victims(
                ready, load, current - target, keep=min(1, self.config.min_replicas)
            )
            log.info(
                "scale down %d -> %d (%s): draining %s",
                current,
                target,
                decision.reason,
                [v.id for v in victims],
            )
            for victim in victims:
                self._spawn(self._drain_one(victim))
        if self.metrics is not None:
            self.metrics.observe(
                ready=len(ready),
                starting=self.pending_starts,
                draining=self.draining(),
                desired=target,
                decision=decision,
                forecast_rps=forecast,
                previous=current if self.act else self._last_target,
            )
            self.metrics.observe_forecasts(self.forecasts.views())
        self._last_target = target  # observe mode: a scale event is a change of the decision
        return target

    def draining(self) -> int:
        return sum(1 for r in self.provider.replicas() if r.state is ReplicaState.DRAINING)

    def _replace_dead(self) -> None:
        """A replica whose process exited on its own leaves the rotation; the next decisions
        see the smaller fleet and start another if the load (or min_replicas) asks."""
        for r in self.ready():
            if not self.provider.alive(r):
                log.error("replica %s exited on its own; dropping it", r.id)
                self._spawn(self.provider.drain(r, timeout_s=0))  # collects the exit code
                r.state = ReplicaState.STOPPED
        self.publish()

    async def run(self, stop: asyncio.Event) -> None:
        """Decide every `interval_s` until `stop` is set."""
        async with httpx.AsyncClient() as client:
            while not stop.is_set():
                try:
                    await self.step(client)
                except Exception:  # one bad tick must not end the loop
                    log.exception("autoscaler step failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.interval_s)

    async def close(self) -> None:
        """Let starts and drains under way finish, then drain every replica."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.provider.close(self.config.drain_timeout_s)
        self.publish()


def pick_victims(
    ready: list[Replica], load: dict[str, float], count: int, keep: int = 1
) -> list[Replica]:
    """The replicas to drain, leaving `keep`: the least loaded (fewest requests to finish),
    newest first on a tie (the oldest have the warmest prefix caches)."""
    order = sorted(ready, key=lambda r: (load.get(r.url, 0.0), -r.started_s))
    return order[: max(0, min(count, len(ready) - keep))]


async def scrape_awaiting(client: httpx.AsyncClient, url: str | None, timeout_s: float) -> float:
    """Requests the gateway holds for want of any upstream (0 when it cannot be read)."""
    if url is None:
        return 0.0
    try:
        resp = await client.get(url + "/metrics", timeout=timeout_s)
        resp.raise_for_status()
    except httpx.HTTPError:
        return 0.0
    return scan_metrics(resp.text, {AWAITING: "awaiting"}).get("awaiting", 0.0)
