"""Retry budget, backoff and Retry-After parsing."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from surge.gateway.config import RetryConfig
from surge.gateway.retry import RetryBudget, backoff_s, parse_retry_after, retry_after_header


def test_budget_is_a_minimum_plus_a_share_of_requests() -> None:
    budget = RetryBudget(ratio=0.2, min_retries=3, window_s=10)
    allowed = 0
    while budget.can_retry(0.0):
        budget.record_retry(0.0)
        allowed += 1
    assert allowed == 3  # no requests yet: only the minimum
    for _ in range(50):
        budget.record_request(1.0)
    while budget.can_retry(1.0):
        budget.record_retry(1.0)
        allowed += 1
    assert allowed == 3 + 10  # + 20% of 50


def test_budget_window_slides() -> None:
    budget = RetryBudget(ratio=0.0, min_retries=2, window_s=10)
    budget.record_retry(0.0)
    budget.record_retry(5.0)
    assert not budget.can_retry(9.9)
    assert budget.can_retry(10.1)  # the retry at 0 left the window


def test_backoff_is_jittered_exponential_and_capped() -> None:
    cfg = RetryConfig(backoff_base_s=0.1, backoff_max_s=0.5)
    rng = random.Random(0)
    for n, ceiling in ((0, 0.1), (1, 0.2), (2, 0.4), (3, 0.5), (40, 0.5)):
        draws = [backoff_s(n, cfg, rng) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in draws)
        assert max(draws) > 0.8 * ceiling  # full jitter spans the range
        assert len(set(draws)) > 150


def test_retry_after_parsing() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("inf") is None
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    seconds = parse_retry_after(when)
    assert seconds is not None and 25 < seconds <= 30


def test_retry_after_header_rounds_up_to_whole_seconds() -> None:
    assert retry_after_header(0.2) == "1"
    assert retry_after_header(1.0) == "1"
    assert retry_after_header(2.1) == "3"
    assert retry_after_header(float("nan")) == "1"
