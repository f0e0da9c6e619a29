"""The endpoint picker's decision: which upstream takes a request, with the gateway's own pool,
balancers and breakers (the HTTP proxy's `_choose`, without the sending), or why none does.

NOTE: one decision (Picker.pick)

    candidates: the group's upstreams in rotation that serve the model, within the subset hint
        none within a given subset             -> 503 (GIE: the data plane said where, none fits)
        none of the primaries                  -> the fallback group, else 503 (or 404: no
                                                  upstream serves the model)
    every candidate saturated (GIE's detector: waiting, KV usage, or --max-in-flight-per-upstream)
        sheddable (priority < 0)               -> 429
        otherwise the gateway's degrade action -> shed (429/503), fallback group, cap max_tokens
    balancer.pick over the fresh ones, breaker.allow -> the primary (a permit, one in flight)
    fallbacks: the other candidates the breaker admits, least loaded first

The permit is held until `Picker.report` (the data plane's answer came back) and the in-flight
count until `Picker.release` (the request's ext_proc stream ended).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from surge.gateway.balancers import Balancer
from surge.gateway.breaker import Outcome, Permit, classify_status
from surge.gateway.config import DegradeAction, GatewayConfig
from surge.gateway.degrade import decide, is_saturated
from surge.gateway.errors import GatewayError, NotFound, TooManyRequests, Unavailable
from surge.gateway.proxy import MAX_THROTTLE_S
from surge.gateway.upstreams import FALLBACK, PRIMARY, RouteKey, Upstream, UpstreamPool


def endpoint_of(url: str) -> str:
    """`host:port` of an upstream url, as GIE's headers carry it (`[v6]:port` for IPv6)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class PickRequest:
    key: RouteKey
    model: str | None = None
    priority: int = 0  # GIE's: higher is more important, negative is sheddable
    subset: frozenset[str] | None = None  # endpoints (host:port) the data plane allows


@dataclass(slots=True)
class Pick:
    primary: Upstream
    permit: Permit
    fallbacks: tuple[Upstream, ...] = ()
    cap_max_tokens: int | None = None  # the degrade action asks for a smaller answer
    degraded: str | None = None  # x-surge-degraded's value, when degraded
    reported: bool = False  # the breaker has its outcome
    released: bool = False  # the in-flight count is given back

    @property
    def endpoints(self) -> str:
        """The header's and the metadata's value: the primary, then the fallbacks."""
        return ",".join(endpoint_of(u.url) for u in (self.primary, *self.fallbacks))


@dataclass(frozen=True, slots=True)
class Refusal:
    error: GatewayError  # its status, OpenAI body and Retry-After make the immediate response
    reason: str  # the metric's label


class Picker:
    def __init__(
        self,
        config: GatewayConfig,
        pool: UpstreamPool,
        balancers: Mapping[str, Balancer],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.pool = pool
        self.balancers = balancers
        self.clock = clock
        self.priorities = config.epp.priorities

    def priority_of(self, objective: str | None) -> int:
        """An InferenceObjective's priority (configured), a bare integer's own, else 0."""
        if not objective:
            return 0
        if objective in self.priorities:
            return self.priorities[objective]
        try:
            return int(objective)
        except ValueError:
            return 0

    def pick(self, req: PickRequest) -> Pick | Refusal:
        now_s = self.clock()
        group = PRIMARY
        candidates = self._candidates(PRIMARY, now_s, req)
        if not candidates and req.subset is not None:
            return _unavailable("no endpoint of the subset hint is ready", "subset_empty", 1.0)
        if not candidates:
            group = FALLBACK
            candidates = self._candidates(FALLBACK, now_s, req)
        if not candidates:
            if req.model is not None and self.pool.candidates(PRIMARY, now_s):
                message = f"The model `{req.model}` does not exist on any upstream."
                err: GatewayError = NotFound(message, code="model_not_found")
                return Refusal(err, "model_not_found")
            return _unavailable("no healthy upstream is available", "no_healthy_upstream", 1.0)
        cap, degraded = None, None
        if group == PRIMARY and self._saturated(candidates):
            if req.priority < 0:
                err = TooManyRequests(
                    "every endpoint is saturated: a sheddable request is shed first",
                    code="sheddable_shed",
                    retry_after_s=self.config.degrade.retry_after_s,
                )
                return Refusal(err, "sheddable_shed")
            fallback = [u.snapshot() for u in self._candidates(FALLBACK, now_s, req)]
            decision = decide([u.snapshot() for u in candidates], fallback, self.config.degrade)
            degraded = decision.header
            if decision.action is DegradeAction.SHED:
                cls = TooManyRequests if self.config.degrade.shed_status == 429 else Unavailable
                err = cls(
                    "every upstream is saturated; retry later",
                    code="overloaded",
                    retry_after_s=self.config.degrade.retry_after_s,
                )
                return Refusal(err, "saturated")
            if decision.action is DegradeAction.FALLBACK:
                group, candidates = FALLBACK, self._candidates(FALLBACK, now_s, req)
            elif decision.action is DegradeAction.CAP_MAX_TOKENS:
                cap = self.config.degrade.max_tokens_cap
        chosen = self._choose(group, candidates, req.key, now_s)
        if chosen is None:
            return _unavailable("every circuit is open", "no_healthy_upstream", 1.0)
        up, permit = chosen
        up.in_flight += 1
        rest = sorted(
            (u for u in candidates if u is not up and u.breaker.can_attempt(now_s)),
            key=lambda u: u.snapshot().load / u.config.weight,
        )
        fallbacks = tuple(rest[: self.config.epp.fallbacks])
        return Pick(up, permit, fallbacks, cap_max_tokens=cap, degraded=degraded)

    def report(
        self,
        pick: Pick,
        status: int,
        served: str | None = None,
        via_upstream: bool = True,
        retry_after_s: float | None = None,
    ) -> None:
        """The data plane's answer: `status` from `served` (host:port; None: the primary), or
        from the data plane itself (not `via_upstream`: it could not reach the endpoint).
        Ends the pick's breaker permit, once."""
        if pick.reported:
            return
        pick.reported = True
        up, now_s = pick.primary, self.clock()
        outcome = classify_status(status)
        if not via_upstream and status >= 500:
            outcome = Outcome.FAILURE
        if served is not None and served != endpoint_of(up.url):
            # It went down the fallback list: the primary failed, the one that served answered.
            _record(up, pick.permit, Outcome.FAILURE, now_s)
            other = next((u for u in pick.fallbacks if endpoint_of(u.url) == served), None)
            if other is not None and (permit := other.breaker.allow(now_s)) is not None:
                _record(other, permit, outcome, now_s)
            return
        _record(up, pick.permit, outcome, now_s)
        if outcome is Outcome.REFUSED and via_upstream and retry_after_s is not None:
            up.throttled_until_s = now_s + min(retry_after_s, MAX_THROTTLE_S)

    def release(self, pick: Pick) -> None:
        """The request is over (its ext_proc stream ended): its in-flight count goes, and a
        permit with no answer reported is cancelled. Once."""
        if pick.released:
            return
        pick.released = True
        pick.primary.in_flight -= 1
        if not pick.reported:
            pick.reported = True
            pick.primary.breaker.cancel(pick.permit)

    def _candidates(self, group: str, now_s: float, req: PickRequest) -> list[Upstream]:
        found = self.pool.candidates(group, now_s, model=req.model)
        if req.subset is not None:
            found = [u for u in found if endpoint_of(u.url) in req.subset]
        return found

    def _saturated(self, candidates: Sequence[Upstream]) -> bool:
        epp, degrade = self.config.epp, self.config.degrade
        for u in candidates:
            s = u.snapshot()
            if is_saturated(s, degrade):
                continue
            if s.num_waiting is not None and s.num_waiting >= epp.saturation_waiting:
                continue
            if s.kv_cache_usage is not None and s.kv_cache_usage >= epp.saturation_kv_usage:
                continue
            return False
        return True

    def _choose(
        self, group: str, candidates: list[Upstream], key: RouteKey, now_s: float
    ) -> tuple[Upstream, Permit] | None:
        fresh = [u for u in candidates if not u.throttled(now_s)] or list(candidates)
        balancer = self.balancers[group]
        while fresh:
            url = balancer.pick([u.snapshot() for u in fresh], key)
            up = next((u for u in fresh if u.url == url), None)
            if up is None:
                return None
            permit = up.breaker.allow(now_s)
            if permit is not None:
                return up, permit
            fresh.remove(up)
        return None


def _unavailable(message: str, reason: str, retry_after_s: float) -> Refusal:
    return Refusal(Unavailable(message, code=reason, retry_after_s=retry_after_s), reason)


def _record(up: Upstream, permit: Permit, outcome: Outcome, now_s: float) -> None:
    if outcome is Outcome.REFUSED:
        up.breaker.cancel(permit)
        return
    ok = outcome is Outcome.SUCCESS
    up.breaker.record(permit, ok, now_s)
    up.health.on_traffic(ok, now_s)
