"""GatewayState: what the gateway's routes and background tasks share (app.py builds it)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from surge.gateway.balancers import Balancer, make_balancer
from surge.gateway.config import GatewayConfig, Policy
from surge.gateway.kv_index import KvIndex
from surge.gateway.limits import ConcurrencyLimiter
from surge.gateway.metrics import GatewayMetrics
from surge.gateway.proxy import Proxy
from surge.gateway.response_owners import ResponseOwners
from surge.gateway.upstreams import FALLBACK, PRIMARY, UpstreamPool
from surge.observability.tracing import Tracing


@dataclass
class GatewayState:
    config: GatewayConfig
    pool: UpstreamPool
    balancers: dict[str, Balancer]
    metrics: GatewayMetrics
    limiter: ConcurrencyLimiter
    reload_now: asyncio.Event = field(default_factory=asyncio.Event)  # set by SIGHUP
    proxy: Proxy | None = None  # built in the lifespan, with the HTTP client
    tracing: Tracing = field(default_factory=Tracing.off)  # started in the lifespan
    owners: ResponseOwners = field(default_factory=ResponseOwners)  # stored responses' homes
    draining: bool = False  # SIGTERM (launch.py): not ready, new requests get 503
    kv_index: KvIndex | None = None  # --policy kv_aware: fed by kv_subscriber.py

    @classmethod
    def create(cls, config: GatewayConfig) -> GatewayState:
        rng = random.Random(config.seed)
        # One index of every replica's blocks: what its events say it holds, and for a short
        # while (routed claims, --kv-routed-ttl) what was just sent there.
        kv_index = KvIndex(config.kv.routed_ttl_s) if config.policy is Policy.KV_AWARE else None
        return cls(
            config=config,
            pool=UpstreamPool(config),
            # Each group learns on its own: a fallback's prefixes say nothing of the primaries.
            balancers={
                g: make_balancer(config.policy, config.prefix, rng, kv_index)
                for g in (PRIMARY, FALLBACK)
            },
            metrics=GatewayMetrics(),
            limiter=ConcurrencyLimiter(config.limits),
            kv_index=kv_index,
        )
