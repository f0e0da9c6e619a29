"""Retry budget, jittered backoff and Retry-After parsing; pure, clock passed in.

A request is retried only before its first byte reached the client, and always on an upstream
it has not tried yet; the proxy enforces both. The budget bounds retries as a whole so that an
outage does not multiply the load on the upstreams that are left (a retry storm).
"""

from __future__ import annotations

import math
import random
from collections import deque
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from surge.gateway.config import RetryConfig
from surge.http.openai_errors import retry_after_header as retry_after_header  # re-exported


class RetryBudget:
    """At most `min_retries + ratio * requests` retries within any `window_s`."""

    def __init__(self, ratio: float, min_retries: int, window_s: float) -> None:
        self.ratio = ratio
        self.min_retries = min_retries
        self.window_s = window_s
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()

    @classmethod
    def from_config(cls, config: RetryConfig) -> RetryBudget:
        return cls(config.budget_ratio, config.budget_min_retries, config.budget_window_s)

    def record_request(self, now_s: float) -> None:
        self._requests.append(now_s)

    def can_retry(self, now_s: float) -> bool:
        self._trim(now_s)
        return len(self._retries) < self.min_retries + self.ratio * len(self._requests)

    def record_retry(self, now_s: float) -> None:
        self._retries.append(now_s)

    def _trim(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        for times in (self._requests, self._retries):
            while times and times[0] < horizon:
                times.popleft()


def backoff_s(num_retries: int, config: RetryConfig, rng: random.Random) -> float:
    """Full jitter: uniform over [0, min(max, base * 2**num_retries)] (retries counted from 0)."""
    ceiling = min(config.backoff_max_s, config.backoff_base_s * 2 ** min(num_retries, 30))
    return rng.uniform(0.0, ceiling)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
