"""Scheduling policies: a policy orders requests and never touches blocks or tensors.

The scheduler admits waiting requests in ascending `key` order and, when it must preempt, takes
the running request with the largest key. Every policy breaks ties by arrival, so the order is
total and scheduling is deterministic.

- fcfs: arrival order.
- priority: lower `priority` runs sooner (vLLM's convention), with aging. The key is the virtual
  deadline `arrival_s + aging_s * priority`: waiting `aging_s` seconds is worth one priority level,
  so a request of priority p that arrives at t0 runs before every request of priority q < p that
  arrives after t0 + aging_s * (p - q). Under a never-ending flood of urgent work, a low-priority
  request therefore waits only for the urgent work that arrived in that window: it cannot starve.
- fair: virtual token counters per tenant (VTC, Sheng et al., OSDI 2024). Each scheduled token
  adds its cost (prompt and output tokens weighted) divided by the tenant's weight to the tenant's
  counter; the tenant with the smallest counter goes first. A tenant that becomes active again is
  lifted to the smallest counter among active tenants, so idle time earns no credit.
- priority-fair: priority bands (aged one level per `aging_s` of waiting), fair share within a band.
"""

from __future__ import annotations

import math
from typing import Protocol

from surge.engine.config import SCHEDULING_POLICIES, SchedulerConfig
from surge.engine.core.request import Request


class Policy(Protocol):
    def key(self, req: Request, now_s: float) -> tuple[float, ...]:
        """Sort key: smaller runs sooner; among running requests the largest is preempted first.

        Must be a total order (break ties by arrival) so that scheduling is deterministic.
        """
        ...

    def on_add(self, req: Request) -> None:
        """A request entered the scheduler (before it is ever ranked)."""
        ...

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        """`req` gets `num_tokens` of compute this step; called before its progress advances."""
        ...

    def on_finish(self, req: Request) -> None:
        """A request left the scheduler for good (finished or aborted)."""
        ...

    def should_preempt(self, newcomer: Request, victim: Request, now_s: float) -> bool:
        """Whether waiting `newcomer` may displace running `victim` when the batch is full.

        The scheduler asks only when `newcomer` is the next to admit and cannot fit, and only
        about the running request it ranks last. False keeps running work running.
        """
        ...


class FCFSPolicy:
    """First come, first served: order of arrival; the latest arrival is preempted first."""

    def key(self, req: Request, now_s: float) -> tuple[float, ...]:
        return (req.arrival_s, req.seq_no)

    def on_add(self, req: Request) -> None:
        return None

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        return None

    def on_finish(self, req: Request) -> None:
        return None

    def should_preempt(self, newcomer: Request, victim: Request, now_s: float) -> bool:
        return False


class PriorityPolicy(FCFSPolicy):
    """Lower priority value first; aging by virtual deadline (see the module docstring)."""

    def __init__(self, aging_s: float | None, preemption_threshold: int | None) -> None:
        self.aging_s = aging_s
        self.preemption_threshold = preemption_threshold

    def key(self, req: Request, now_s: float) -> tuple[float, ...]:
        if self.aging_s is None:
            return (req.priority, req.arrival_s, req.seq_no)
        return (req.arrival_s + self.aging_s * req.priority, req.seq_no)

    def should_preempt(self, newcomer: Request, victim: Request, now_s: float) -> bool:
        return _priority_preempts(self, self.preemption_threshold, newcomer, victim, now_s)


def _priority_preempts(
    policy: Policy, threshold: int | None, newcomer: Request, victim: Request, now_s: float
) -> bool:
    # The raw gap gates preemption (as SGLang's threshold); the policy's own order must agree,
    # so an aged low-priority request is not displaced by fresh urgent work it already outranks.
    if threshold is None or victim.priority - newcomer.priority < threshold:
        return False
    return policy.key(newcomer, now_s) < policy.key(victim, now_s)


class TenantCounters:
    """Virtual token counters per tenant, with VTC's lift for tenants that become active."""

    def __init__(
        self,
        weights: dict[str, float],
        default_weight: float,
        prompt_token_cost: float,
        output_token_cost: float,
        max_tenants: int = 100_000,
    ) -> None:
        self.weights = weights
        self.default_weight = default_weight
        self.prompt_token_cost = prompt_token_cost
        self.output_token_cost = output_token_cost
        self.max_tenants = max_tenants
        self.counters: dict[str, float] = {}
        self.num_active: dict[str, int] = {}  # tenant -> requests in the scheduler

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def on_add(self, req: Request) -> None:
        tenant = req.tenant
        if self.num_active.get(tenant, 0) == 0:
            # Idle time earns no credit: start no lower than the least-served active tenant.
            floor = min((self.counters[t] for t in self.num_active), default=0.0)
            self.counters[tenant] = max(self.counters.get(tenant, floor), floor)
            self._bound()
        self.num_active[tenant] = self.num_active.get(tenant, 0) + 1

    def on_finish(self, req: Request) -> None:
        left = self.num_active.get(req.tenant, 0) - 1
        if left > 0:
            self.num_active[req.tenant] = left
        else:
            self.num_active.pop(req.tenant, None)

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        # A one-token step past the prompt is a decode; anything else is prefill work, including
        # the recompute of a preempted request's output (which is what it costs).
        is_decode = num_tokens == 1 and req.num_computed_tokens >= req.num_prompt_tokens
        cost = num_tokens * (self.output_token_cost if is_decode else self.prompt_token_cost)
        weight = self.weights.get(req.tenant, self.default_weight)
        self.counters[req.tenant] = self.counter(req.tenant) + cost / weight

    def _bound(self) -> None:
        # Forgetting an idle tenant is safe: on return it is lifted to the active minimum anyway.
        while len(self.counters) > self.max_tenants:
            idle = [t for t in self.counters if t not in self.num_active]
            if not idle:
                return
            del self.counters[min(idle, key=self.counters.__getitem__)]


class FairSharePolicy(FCFSPolicy):
    """Smallest weighted token service first (VTC); FCFS within a tenant."""

    def __init__(self, counters: TenantCounters) -> None:
        self.tenants = counters

    def key(self, req: Request, now_s: float) -> tuple[float, ...]:
        return (self.tenants.counter(req.tenant), req.arrival_s, req.seq_no)

    def on_add(self, req: Request) -> None:
        self.tenants.on_add(req)

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        self.tenants.on_scheduled(req, num_tokens)

    def on_finish(self, req: Request) -> None:
        self.tenants.on_finish(req)


class PriorityFairPolicy(FairSharePolicy):
    """Priority bands, each band one level more urgent per `aging_s` waited; fair within a band."""

    def __init__(
        self, counters: TenantCounters, aging_s: float | None, preemption_threshold: int | None
    ) -> None:
        super().__init__(counters)
        self.aging_s = aging_s
        self.preemption_threshold = preemption_threshold

    def band(self, req: Request, now_s: float) -> float:
        if self.aging_s is None:
            return float(req.priority)
        return req.priority - math.floor(max(0.0, now_s - req.arrival_s) / self.aging_s)

    def key(self, req: Request, now_s: float) -> tuple[float, ...]:
        counter = self.tenants.counter(req.tenant)
        return (self.band(req, now_s), counter, req.arrival_s, req.seq_no)

    def should_preempt(self, newcomer: Request, victim: Request, now_s: float) -> bool:
        return _priority_preempts(self, self.preemption_threshold, newcomer, victim, now_s)


def make_policy(config: SchedulerConfig) -> Policy:
    name = config.policy
    if name == "fcfs":
        return FCFSPolicy()
    if name == "priority":
        return PriorityPolicy(config.priority_aging_s, config.preemption_threshold)
    counters = TenantCounters(
        dict(config.tenant_weights),
        config.default_tenant_weight,
        config.prompt_token_cost,
        config.output_token_cost,
    )
    if name == "fair":
        return FairSharePolicy(counters)
    if name == "priority-fair":
        return PriorityFairPolicy(counters, config.priority_aging_s, config.preemption_threshold)
    raise ValueError(
        f"unknown scheduling policy {name!r} (available: {', '.join(SCHEDULING_POLICIES)})"
    )
