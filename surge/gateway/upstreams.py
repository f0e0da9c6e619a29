"""Upstream state (in-flight count, scraped load, health, breaker), the pool that reconciles it
with the config and the upstreams file, and the background loops that keep it fresh.

Balancers never see an `Upstream`: they get frozen `UpstreamSnapshot`s and a `RouteKey`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import httpx

from surge.gateway.breaker import CircuitBreaker
from surge.gateway.config import GatewayConfig, UpstreamConfig
from surge.gateway.config_file import read_upstreams_file
from surge.gateway.health import HealthTracker
from surge.observability.scan import scan_metrics

log = logging.getLogger(__name__)

PRIMARY = "primary"
FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class RouteKey:
    """What a request offers the balancer to route on."""

    session: str | None = None  # the session policy's key (x-session-id header or body `user`)
    prefix_hashes: tuple[int, ...] = ()  # chained hashes of the prompt's chunks, in order
    prompt_tokens: tuple[int, ...] | None = None  # the kv_aware policy's: as a replica tokenizes
    cache_salt: str = ""  # the request's cache_salt (the engine mixes it into its block hashes)


@dataclass(frozen=True, slots=True)
class UpstreamSnapshot:
    """One candidate as a balancer sees it: plain numbers, taken at pick time."""

    url: str
    weight: float = 1.0
    in_flight: int = 0  # this gateway's requests on it, exact
    num_waiting: int | None = None  # scraped from its /metrics; None when it does not say
    num_running: int | None = None
    kv_cache_usage: float | None = None
    max_in_flight: int | None = None

    @property
    def load(self) -> int:
        """Outstanding requests: our own count, or the upstream's if it reports more (other
        clients, or requests we gave up on that it still runs)."""
        scraped = (self.num_waiting or 0) + (self.num_running or 0)
        return max(self.in_flight, scraped)


@dataclass(frozen=True, slots=True)
class ScrapedLoad:
    num_waiting: int | None = None
    num_running: int | None = None
    kv_cache_usage: float | None = None


# name in /metrics -> ScrapedLoad field; vLLM/Surge first, SGLang's equivalents too.
_LOAD_METRICS = {
    "vllm:num_requests_waiting": "num_waiting",
    "vllm:num_requests_running": "num_running",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "sglang:num_queue_reqs": "num_waiting",
    "sglang:num_running_reqs": "num_running",
    "sglang:token_usage": "kv_cache_usage",
}


def parse_load(text: str) -> ScrapedLoad:
    """Queue, running and KV usage from Prometheus text; absent metrics stay None."""
    found = scan_metrics(text, _LOAD_METRICS, keep_max=("kv_cache_usage",))
    waiting, running = found.get("num_waiting"), found.get("num_running")
    return ScrapedLoad(
        num_waiting=None if waiting is None else int(waiting),
        num_running=None if running is None else int(running),
        kv_cache_usage=found.get("kv_cache_usage"),
    )


class Upstream:
    """Mutable state of one upstream; only the event loop thread touches it."""

    def __init__(self, config: UpstreamConfig, group: str, gateway: GatewayConfig) -> None:
        self.url = config.url
        self.group = group
        self.in_flight = 0
        self.load = ScrapedLoad()
        self.breaker = CircuitBreaker(gateway.breaker)
        self.health = HealthTracker(gateway.health)
        self.throttled_until_s = 0.0  # it asked for a pause (429/503 Retry-After) until then
        # The model names its /v1/models lists (base models, LoRA adapters); None: not known.
        self.models: frozenset[str] | None = None
        self._default_max_in_flight = gateway.degrade.max_in_flight
        self.config = config

    @property
    def config(self) -> UpstreamConfig:
        return self._config

    @config.setter
    def config(self, config: UpstreamConfig) -> None:
        self._config = config
        self.max_in_flight = config.max_in_flight or self._default_max_in_flight

    def in_rotation(self, now_s: float) -> bool:
        return self.health.is_healthy(now_s) and self.breaker.can_attempt(now_s)

    def serves(self, model: str | None) -> bool:
        """Whether a request for `model` may go here: it lists it, or its list is unknown."""
        return model is None or self.models is None or model in self.models

    def throttled(self, now_s: float) -> bool:
        return now_s < self.throttled_until_s

    def snapshot(self) -> UpstreamSnapshot:
        return UpstreamSnapshot(
            url=self.url,
            weight=self._config.weight,
            in_flight=self.in_flight,
            num_waiting=self.load.num_waiting,
            num_running=self.load.num_running,
            kv_cache_usage=self.load.kv_cache_usage,
            max_in_flight=self.max_in_flight,
        )


class UpstreamPool:
    """The upstreams the gateway knows: static ones from the config plus those of the file
    plus those found by DNS (dns_watch.py); on a clash the static one wins, then the file's.

    Reconciling keeps an upstream's state (breaker, health, in-flight) when it stays; one that
    leaves is dropped here while its in-flight requests finish on the object they hold.
    """

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self._static: dict[str, tuple[UpstreamConfig, str]] = {}
        for group, ups in ((PRIMARY, config.upstreams), (FALLBACK, config.fallback_upstreams)):
            for u in ups:
                self._static[u.url] = (u, group)
        self._upstreams: dict[str, Upstream] = {}
        self._file: list[tuple[UpstreamConfig, str]] = []
        self._discovered: list[tuple[UpstreamConfig, str]] = []
        self._reconcile(self._static)

    def set_dynamic(
        self, primary: Iterable[UpstreamConfig], fallback: Iterable[UpstreamConfig] = ()
    ) -> bool:
        """Replace the file's upstreams (static ones win on a clash); True if anything changed."""
        self._file = [(u, g) for g, ups in ((PRIMARY, primary), (FALLBACK, fallback)) for u in ups]
        return self._reconcile(self._wanted())

    def set_discovered(self, urls: Iterable[str]) -> bool:
        """Replace the upstreams found by DNS (primaries); True if anything changed."""
        self._discovered = [(UpstreamConfig(url), PRIMARY) for url in urls]
        return self._reconcile(self._wanted())

    def _wanted(self) -> dict[str, tuple[UpstreamConfig, str]]:
        wanted = dict(self._static)
        for u, group in (*self._file, *self._discovered):
            wanted.setdefault(u.url, (u, group))
        return wanted

    def _reconcile(self, wanted: dict[str, tuple[UpstreamConfig, str]]) -> bool:
        changed = False
        for url in list(self._upstreams):
            if url not in wanted:
                del self._upstreams[url]
                log.warning("upstream %s removed", url)
                changed = True
        for url, (cfg, group) in wanted.items():
            current = self._upstreams.get(url)
            if current is None or current.group != group:
                self._upstreams[url] = Upstream(cfg, group, self.config)
                log.info("upstream %s added (%s)", url, group)
                changed = True
            elif current.config != cfg:
                current.config = cfg
                changed = True
        return changed

    def get(self, url: str) -> Upstream | None:
        return self._upstreams.get(url)

    def all(self) -> list[Upstream]:
        return list(self._upstreams.values())

    def group(self, group: str) -> list[Upstream]:
        return [u for u in self._upstreams.values() if u.group == group]

    def candidates(
        self, group: str, now_s: float, exclude: Iterable[str] = (), model: str | None = None
    ) -> list[Upstream]:
        """Upstreams of `group` in rotation (healthy, circuit admits) that serve `model`, minus
        `exclude`."""
        skip = set(exclude)
        return [
            u
            for u in self._upstreams.values()
            if u.group == group and u.url not in skip and u.serves(model) and u.in_rotation(now_s)
        ]


def parse_models(body: object) -> frozenset[str] | None:
    """The ids of an OpenAI /v1/models answer, or None when it is not one."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return frozenset(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str))


async def scrape_loop(
    targets: Callable[[], Sequence[Upstream]],
    client: httpx.AsyncClient,
    interval_s: float,
    timeout_s: float,
) -> None:
    """Refresh every upstream's load from its /metrics and the models it serves from its
    /v1/models each interval, until cancelled."""

    async def scrape(u: Upstream) -> None:
        try:
            r = await client.get(u.url + "/metrics", timeout=timeout_s)
            u.load = parse_load(r.text) if r.status_code == 200 else ScrapedLoad()
        except httpx.HTTPError:
            u.load = ScrapedLoad()  # unknown beats stale
        try:
            r = await client.get(u.url + "/v1/models", timeout=timeout_s)
            # Unknown (an error, or a 401 from an upstream with API keys): route anything.
            u.models = parse_models(r.json()) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            u.models = None

    while True:
        await asyncio.gather(*(scrape(u) for u in targets()))
        await asyncio.sleep(interval_s)


async def reload_upstreams(pool: UpstreamPool, path: str) -> bool:
    """Read the upstreams file (in a thread: file I/O blocks) into the pool."""
    primary, fallback = await asyncio.to_thread(read_upstreams_file, path)
    return pool.set_dynamic(primary, fallback)


async def watch_upstreams_file(
    pool: UpstreamPool, path: str, interval_s: float, reload_now: asyncio.Event
) -> None:
    """Reload when the file's mtime changes or `reload_now` is set (SIGHUP), until cancelled."""
    last_mtime: int | None = None
    with contextlib.suppress(OSError):
        last_mtime = (await asyncio.to_thread(os.stat, path)).st_mtime_ns
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await reload_now.wait()
        try:
            mtime: int | None = (await asyncio.to_thread(os.stat, path)).st_mtime_ns
        except OSError:
            mtime = None
        if not reload_now.is_set() and mtime == last_mtime:
            continue
        reload_now.clear()
        last_mtime = mtime
        try:
            if await reload_upstreams(pool, path):
                log.info("upstreams reloaded from %s: %s", path, [u.url for u in pool.all()])
        except (OSError, ValueError) as e:
            log.error("cannot reload upstreams from %s (keeping the current set): %s", path, e)
