"""The circuit breaker on a driven clock: exact states at exact times."""

from __future__ import annotations

from surge.gateway.breaker import BreakerState, CircuitBreaker, Outcome, classify_status
from surge.gateway.config import BreakerConfig

CLOSED, HALF_OPEN, OPEN = BreakerState.CLOSED, BreakerState.HALF_OPEN, BreakerState.OPEN


def run(b: CircuitBreaker, ok: bool, now_s: float) -> None:
    permit = b.allow(now_s)
    assert permit is not None
    b.record(permit, ok, now_s)


def test_opens_after_consecutive_failures_then_half_opens_and_closes() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=3, open_s=10, success_threshold=2))
    run(b, False, 0.0)
    run(b, False, 1.0)
    run(b, True, 2.0)  # a success resets the streak
    run(b, False, 3.0)
    run(b, False, 4.0)
    assert b.state(4.0) is CLOSED
    run(b, False, 5.0)
    assert b.state(5.0) is OPEN
    assert b.allow(14.9) is None and not b.can_attempt(14.9)
    assert b.retry_in_s(12.0) == 3.0
    # Cool-down over: half-open admits one trial at a time.
    assert b.state(15.0) is HALF_OPEN and b.can_attempt(15.0)
    trial = b.allow(15.0)
    assert trial is not None and trial.trial
    assert b.allow(15.1) is None and not b.can_attempt(15.1)
    b.record(trial, True, 16.0)
    assert b.state(16.0) is HALF_OPEN  # one of two successes
    run(b, True, 17.0)
    assert b.state(17.0) is CLOSED


def test_half_open_failure_reopens_for_a_full_cool_down() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, open_s=5))
    run(b, False, 0.0)
    trial = b.allow(5.0)
    assert trial is not None
    b.record(trial, False, 6.0)
    assert b.state(6.0) is OPEN
    assert b.state(10.9) is OPEN and b.state(11.0) is HALF_OPEN


def test_failure_rate_over_window_needs_min_requests() -> None:
    cfg = BreakerConfig(failure_threshold=100, failure_rate=0.5, min_requests=10, window_s=60)
    b = CircuitBreaker(cfg)
    for i in range(8):
        run(b, i % 2 == 0, float(i))  # alternate: never 2 failures in a row
    assert b.state(8.0) is CLOSED  # 50% but only 8 outcomes
    run(b, True, 8.0)
    run(b, False, 9.0)
    assert b.state(9.0) is OPEN  # 10 outcomes, 5 failures


def test_window_forgets_old_outcomes() -> None:
    cfg = BreakerConfig(failure_threshold=100, failure_rate=0.5, min_requests=4, window_s=10)
    b = CircuitBreaker(cfg)
    for t in range(3):
        run(b, False, float(t))  # old failures ...
    for t in range(20, 23):
        run(b, True, float(t))  # ... gone from the window by now
    run(b, False, 23.0)
    assert b.state(23.0) is CLOSED  # 1 failure in 4


def test_half_open_admits_a_limited_number_of_trials() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, open_s=1, half_open_max_requests=2))
    run(b, False, 0.0)
    t1, t2 = b.allow(1.0), b.allow(1.0)
    assert t1 is not None and t2 is not None and b.allow(1.0) is None
    b.cancel(t1)  # a trial that ended without a verdict (429, client left) frees its slot
    assert b.allow(1.0) is not None


def test_late_outcome_from_before_the_transition_is_ignored() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=1, open_s=1, success_threshold=1))
    old = b.allow(0.0)
    run(b, False, 0.0)  # opens
    assert old is not None
    b.allow(1.0)  # half-open, one trial in flight
    b.record(old, True, 1.5)  # admitted while closed: not a trial, must not close the circuit
    assert b.state(1.5) is HALF_OPEN
    assert b.allow(1.5) is None  # and it did not free the trial slot


def test_only_5xx_other_than_503_are_failures() -> None:
    assert classify_status(200) is Outcome.SUCCESS
    for code in (400, 401, 404, 413, 422):
        assert classify_status(code) is Outcome.SUCCESS  # the request's fault (sglang#25811)
    assert classify_status(429) is Outcome.REFUSED  # back-pressure (sglang#13894)
    assert classify_status(503) is Outcome.REFUSED
    for code in (500, 502, 504):
        assert classify_status(code) is Outcome.FAILURE


def test_many_4xx_and_429_never_open_it() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=2, min_requests=2))
    for t in range(100):
        permit = b.allow(float(t))
        assert permit is not None
        outcome = classify_status(400 if t % 2 else 429)
        if outcome is Outcome.REFUSED:
            b.cancel(permit)
        else:
            b.record(permit, outcome is Outcome.SUCCESS, float(t))
    assert b.state(100.0) is CLOSED
