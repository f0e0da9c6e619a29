"""Per-upstream circuit breaker: closed -> open -> half-open -> closed, pure, clock passed in.

NOTE: the state machine

    CLOSED --(failure_threshold consecutive failures, or failure_rate over window_s
              with >= min_requests outcomes)--> OPEN
    OPEN --(open_s elapsed; checked on the next allow)--> HALF_OPEN
    HALF_OPEN: admits up to half_open_max_requests trials at once
        --(success_threshold trial successes)--> CLOSED
        --(one trial failure)--> OPEN (cool-down starts again)

Only failures of the upstream count (connection errors, timeouts, 5xx other than 503).
A 4xx is the request's fault and counts as a success; a 429 or 503 is the upstream saying it is
busy, which is neither (sglang#25811 opened circuits on 400s, sglang#13894 on overload 503s).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import IntEnum, StrEnum

from surge.gateway.config import BreakerConfig


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    REFUSED = "refused"  # back-pressure (429/503): retry elsewhere, but the upstream is not sick


def classify_status(status_code: int) -> Outcome:
    if status_code in (429, 503):
        return Outcome.REFUSED
    if status_code >= 500:
        return Outcome.FAILURE
    return Outcome.SUCCESS


class BreakerState(IntEnum):
    """Values are what the `surge_gateway_breaker_state` gauge shows."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass(frozen=True, slots=True)
class Permit:
    """One admitted request. `epoch` ties its outcome to the state period that admitted it, so
    a request admitted while closed that ends after the circuit moved on cannot pose as a trial."""

    epoch: int
    trial: bool


class CircuitBreaker:
    def __init__(self, config: BreakerConfig) -> None:
        self.config = config
        self._state = BreakerState.CLOSED
        self._epoch = 0
        self._consecutive_failures = 0
        self._window: deque[tuple[float, bool]] = deque()  # (time, ok) of recent outcomes
        self._window_failures = 0
        self._opened_at_s = 0.0
        self._trials_in_flight = 0
        self._trial_successes = 0

    def state(self, now_s: float) -> BreakerState:
        """The state as of now_s (an open circuit past its cool-down reads half-open)."""
        if self._state is BreakerState.OPEN and self._cooled_down(now_s):
            return BreakerState.HALF_OPEN
        return self._state

    def can_attempt(self, now_s: float) -> bool:
        """Whether allow(now_s) would admit a request; changes nothing."""
        state = self.state(now_s)
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        trials = 0 if self._state is BreakerState.OPEN else self._trials_in_flight
        return trials < self.config.half_open_max_requests

    def allow(self, now_s: float) -> Permit | None:
        """Admit one request, or None. Every permit must end in record() or cancel()."""
        if self._state is BreakerState.OPEN:
            if not self._cooled_down(now_s):
                return None
            self._enter(BreakerState.HALF_OPEN, now_s)
        if self._state is BreakerState.CLOSED:
            return Permit(self._epoch, trial=False)
        if self._trials_in_flight >= self.config.half_open_max_requests:
            return None
        self._trials_in_flight += 1
        return Permit(self._epoch, trial=True)

    def record(self, permit: Permit, ok: bool, now_s: float) -> None:
        """The admitted request succeeded (ok) or failed as the upstream's fault."""
        if permit.epoch != self._epoch:
            return  # admitted under an earlier state: says nothing about this one
        if self._state is BreakerState.HALF_OPEN:
            self._trials_in_flight -= 1
            if not ok:
                self._enter(BreakerState.OPEN, now_s)
                return
            self._trial_successes += 1
            if self._trial_successes >= self.config.success_threshold:
                self._enter(BreakerState.CLOSED, now_s)
            return
        if self._state is BreakerState.CLOSED:
            self._observe(ok, now_s)
            if not ok and self._should_open():
                self._enter(BreakerState.OPEN, now_s)

    def cancel(self, permit: Permit) -> None:
        """The request ended without a verdict on the upstream (refused, or the client left)."""
        if permit.trial and permit.epoch == self._epoch:
            self._trials_in_flight -= 1

    def retry_in_s(self, now_s: float) -> float:
        """Seconds until an open circuit admits a trial; 0 when it admits now."""
        if self._state is BreakerState.OPEN:
            return max(0.0, self._opened_at_s + self.config.open_s - now_s)
        return 0.0

    def _cooled_down(self, now_s: float) -> bool:
        return now_s >= self._opened_at_s + self.config.open_s

    def _observe(self, ok: bool, now_s: float) -> None:
        self._consecutive_failures = 0 if ok else self._consecutive_failures + 1
        self._window.append((now_s, ok))
        self._window_failures += not ok
        horizon = now_s - self.config.window_s
        while self._window and self._window[0][0] < horizon:
            _, old_ok = self._window.popleft()
            self._window_failures -= not old_ok

    def _should_open(self) -> bool:
        cfg = self.config
        if self._consecutive_failures >= cfg.failure_threshold:
            return True
        num = len(self._window)
        return num >= cfg.min_requests and self._window_failures >= cfg.failure_rate * num

    def _enter(self, state: BreakerState, now_s: float) -> None:
        self._state = state
        self._epoch += 1
        self._trials_in_flight = 0
        self._trial_successes = 0
        if state is BreakerState.OPEN:
            self._opened_at_s = now_s
        if state is BreakerState.CLOSED:
            self._consecutive_failures = 0
            self._window.clear()
            self._window_failures = 0
