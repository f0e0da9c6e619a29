"""Load shedding at the door: refuse work the engine's queue cannot absorb.

The engine reports what is waiting in its queue, but a request the server has accepted and
not yet handed to the engine (still tokenizing, say) is invisible to it; this controller
counts those itself so a burst cannot slip past the bound between admit and add_request.
"""

from __future__ import annotations

import math
from enum import Enum
from types import TracebackType

from surge.server.errors import RateLimitError, ServiceUnavailableError
from surge.server.queue_wait import Backlog, EngineShape, StepCost, Work


class _State(Enum):
    PENDING = "pending"  # admitted, not yet seen by the engine
    STARTED = "started"  # in the engine, which counts it (while it waits) itself
    RELEASED = "released"


class Admission:
    """One admitted request's ticket. `release()` is idempotent, so it is released exactly once
    however many paths (finally blocks, disconnect callbacks) try; use it as a context manager.
    """

    def __init__(
        self,
        controller: AdmissionController,
        num_tokens: int,
        tenant: str = "",
        work: Work | None = None,
        estimate_s: float | None = None,
    ) -> None:
        self._controller = controller
        self.num_tokens = num_tokens
        self.tenant = tenant
        self.work = work if work is not None else Work(num_tokens, tenant=tenant)
        self.estimate_s = estimate_s  # the wait for a first token estimated at admission
        self._state = _State.PENDING

    @property
    def released(self) -> bool:
        return self._state is _State.RELEASED

    def mark_started(self) -> None:
        """Call when the request starts generating: it no longer counts as queued."""
        if self._state is _State.PENDING:
            self._state = _State.STARTED
            self._controller._leave_pending(self)
            self._controller.backlog.start(self.work)

    def release(self) -> None:
        """Call when the request finished, failed or was aborted."""
        if self._state is _State.RELEASED:
            return
        started = self._state is _State.STARTED
        if not started:
            self._controller._leave_pending(self)
        self._controller.backlog.release(self.work, started)
        self._state = _State.RELEASED
        self._controller._on_released()

    def __enter__(self) -> Admission:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class AdmissionController:
    """Bounds queued requests (and optionally queued prompt tokens) across engine + server.

    Queue full -> 429 (RateLimitError, the client should back off and retry); draining or not
    ready -> 503 (ServiceUnavailableError, try another replica or later). Both carry
    Retry-After = `retry_after_s`.
    """

    def __init__(
        self,
        max_queued_requests: int,
        max_queued_tokens: int | None = None,
        *,
        max_queued_per_tenant: int | None = None,
        retry_after_s: float = 1.0,
        ready: bool = True,
    ) -> None:
        if max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {max_queued_requests}")
        if max_queued_tokens is not None and max_queued_tokens < 1:
            raise ValueError(f"max_queued_tokens must be >= 1 or None, got {max_queued_tokens}")
        self.max_queued_requests = max_queued_requests
        self.max_queued_tokens = max_queued_tokens
        if max_queued_per_tenant is not None and max_queued_per_tenant < 1:
            raise ValueError(f"max_queued_per_tenant must be >= 1, got {max_queued_per_tenant}")
        self.max_queued_per_tenant = max_queued_per_tenant
        self._pending_by_tenant: dict[str, int] = {}  # only tenants with something pending
        self.retry_after_s = retry_after_s
        self.ready = ready
        self._draining = False
        self._pending_requests = 0
        self._pending_tokens = 0
        self._in_flight = 0
        self.backlog = Backlog()
        self.shape = EngineShape()  # the engine's batch, set once it is up
        self.last_estimate_s: float | None = None

    @property
    def draining(self) -> bool:
        return self._draining

    def start_draining(self) -> None:
        """Refuse new requests from now on; admitted ones run to completion."""
        self._draining = True

    def set_ready(self, ready: bool) -> None:
        self.ready = ready

    @property
    def pending_requests(self) -> int:
        return self._pending_requests

    @property
    def pending_tokens(self) -> int:
        return self._pending_tokens

    @property
    def in_flight(self) -> int:
        """Admitted and not yet released (pending or in the engine); 0 means drained."""
        return self._in_flight

    def pending_for(self, tenant: str) -> int:
        return self._pending_by_tenant.get(tenant, 0)

    def check_open(self) -> None:
        """503 with Retry-After while draining or not ready; work of any kind is refused then."""
        if self._draining:
            raise ServiceUnavailableError(
                "server is shutting down", retry_after_s=self.retry_after_s, code="draining"
            )
        if not self.ready:
            raise ServiceUnavailableError(
                "server is not ready", retry_after_s=self.retry_after_s, code="not_ready"
            )

    def admit(
        self,
        num_tokens: int,
        num_waiting: int = 0,
        waiting_tokens: int = 0,
        tenant: str = "",
        *,
        work: Work | None = None,
        max_wait_s: float | None = None,
        step_cost: StepCost | None = None,
    ) -> Admission:
        """Admit one request of `num_tokens` prompt tokens, or raise 429/503.

        `max_wait_s`: refuse (429, Retry-After the estimated wait) a request whose estimated
        wait for its first token (queue_wait.py; `work` describes it, `step_cost` prices an engine
        step by its shape) exceeds it. The count bounds below stay as a backstop.

        `tenant`: with `max_queued_per_tenant` set, one tenant may hold at most that many of the
        queued requests, so a single tenant cannot fill the shared queue ("" is a tenant too).

        `num_waiting` / `waiting_tokens`: a queue outside this controller's own count (the
        server passes none: its count of admitted requests without a first token is exact).
        """
        self.check_open()
        queued = num_waiting + self._pending_requests
        if queued + 1 > self.max_queued_requests:
            raise RateLimitError(
                f"server overloaded: {queued} requests waiting "
                f"(limit {self.max_queued_requests}); retry later",
                retry_after_s=self.retry_after_s,
                code="queue_full",
            )
        queued_tokens = waiting_tokens + self._pending_tokens
        # An empty queue always takes one request, or one larger than the cap would never run.
        if (
            self.max_queued_tokens is not None
            and queued > 0
            and queued_tokens + num_tokens > self.max_queued_tokens
        ):
            raise RateLimitError(
                f"server overloaded: {queued_tokens} prompt tokens waiting "
                f"(limit {self.max_queued_tokens}); retry later",
                retry_after_s=self.retry_after_s,
                code="queue_full",
            )
        work = work if work is not None else Work(num_tokens, tenant=tenant)
        estimate = self.backlog.estimate_s(work, self.shape, step_cost)
        self.last_estimate_s = estimate  # for the metrics, admitted or refused
        if max_wait_s is not None and estimate is not None and estimate > max_wait_s:
            raise RateLimitError(
                f"server overloaded: the estimated wait for a first token is {estimate:.1f}s, "
                f"over this server's limit of {max_wait_s:g}s (--max-queue-wait, or the "
                f"request's own timeout); retry in {math.ceil(estimate)}s",
                retry_after_s=float(math.ceil(estimate)),
                code="queue_wait_exceeded",
            )
        mine = self._pending_by_tenant.get(tenant, 0)
        if self.max_queued_per_tenant is not None and mine + 1 > self.max_queued_per_tenant:
            raise RateLimitError(
                f"too many queued requests for this tenant: {mine} waiting "
                f"(limit {self.max_queued_per_tenant}); retry later",
                retry_after_s=self.retry_after_s,
                code="tenant_queue_full",
            )
        self._pending_requests += 1
        self._pending_tokens += num_tokens
        self._pending_by_tenant[tenant] = mine + 1
        self._in_flight += 1
        self.backlog.add(work)
        return Admission(self, num_tokens, tenant, work, estimate)

    def _leave_pending(self, ticket: Admission) -> None:
        self._pending_requests -= 1
        self._pending_tokens -= ticket.num_tokens
        left = self._pending_by_tenant[ticket.tenant] - 1
        if left:
            self._pending_by_tenant[ticket.tenant] = left
        else:
            del self._pending_by_tenant[ticket.tenant]

    def _on_released(self) -> None:
        self._in_flight -= 1
