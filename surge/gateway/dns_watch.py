"""Upstreams found by DNS: each dns://NAME:PORT target (a Kubernetes headless Service) is
resolved now and then every interval, and the pool follows the addresses it has: a new pod is
added, a gone one dropped (its in-flight requests finish on the object they hold)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from surge.gateway.upstreams import UpstreamPool
from surge.http.discovery import DnsTarget, resolve

log = logging.getLogger(__name__)

Resolver = Callable[[DnsTarget], tuple[str, ...]]


async def discover_once(
    pool: UpstreamPool, targets: Sequence[DnsTarget], resolver: Resolver = resolve
) -> bool:
    """Resolve every target (in threads: getaddrinfo blocks) into the pool; True if it changed.
    A name with no address (a Service scaled to zero) leaves no upstream of its own."""
    found = await asyncio.gather(*(asyncio.to_thread(resolver, t) for t in targets))
    urls = sorted({url for urls in found for url in urls})
    changed = pool.set_discovered(urls)
    if changed:
        log.info("upstreams discovered by DNS: %s", urls)
    return changed


async def watch_dns(
    pool: UpstreamPool,
    targets: Sequence[DnsTarget],
    interval_s: float,
    resolver: Resolver = resolve,
) -> None:
    """Re-resolve every `interval_s` until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await discover_once(pool, targets, resolver)
        except (OSError, ValueError) as e:  # keep the current set; try again next time
            log.error("DNS discovery failed (keeping the current upstreams): %s", e)
