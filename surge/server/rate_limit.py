"""Per-key request and token rate limits: token buckets on a caller-supplied clock.

Nothing here awaits, so under asyncio each call is atomic without a lock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass


class TokenBucket:
    """Holds up to `burst` tokens and refills at `rate_per_s`; starts full.

    A take larger than `burst` could never succeed, so it is allowed when the bucket is full
    and leaves the bucket in debt: oversize requests are slowed to the average rate rather
    than refused forever.
    """

    def __init__(self, rate_per_s: float, burst: float) -> None:
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ValueError(f"rate_per_s must be a positive number, got {rate_per_s}")
        if not (math.isfinite(burst) and burst > 0):
            raise ValueError(f"burst must be a positive number, got {burst}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._last_s: float | None = None

    def _refill(self, now_s: float) -> None:
        # A clock that goes backwards (it should not) adds nothing rather than taking tokens.
        if self._last_s is not None and now_s > self._last_s:
            self._tokens = min(self.burst, self._tokens + (now_s - self._last_s) * self.rate_per_s)
        if self._last_s is None or now_s > self._last_s:
            self._last_s = now_s

    def tokens(self, now_s: float) -> float:
        """Tokens available at `now_s` (negative while in debt)."""
        self._refill(now_s)
        return self._tokens

    def wait_s(self, amount: float, now_s: float) -> float:
        """Seconds until `amount` could be taken; 0.0 if it can be now. Takes nothing."""
        need = min(amount, self.burst)
        have = self.tokens(now_s)
        return 0.0 if have >= need else (need - have) / self.rate_per_s

    def take(self, amount: float, now_s: float) -> None:
        """Remove `amount` unconditionally (callers check `wait_s` first)."""
        self._refill(now_s)
        self._tokens -= amount

    def try_take(self, amount: float, now_s: float) -> float:
        """Take `amount` and return 0.0, or take nothing and return the seconds to wait."""
        wait = self.wait_s(amount, now_s)
        if wait == 0.0:
            self.take(amount, now_s)
        return wait

    def give_back(self, amount: float, now_s: float) -> None:
        """Return unused tokens (e.g. the unspent part of a max_tokens reserve)."""
        self._refill(now_s)
        self._tokens = min(self.burst, self._tokens + amount)

    def is_full(self, now_s: float) -> bool:
        return self.tokens(now_s) >= self.burst


@dataclass(slots=True)
class _KeyBuckets:
    requests: TokenBucket | None
    tokens: TokenBucket | None

    def is_idle(self, now_s: float) -> bool:
        # A full bucket is indistinguishable from a fresh one, so forgetting it loses nothing.
        return all(b is None or b.is_full(now_s) for b in (self.requests, self.tokens))


class RateLimiter:
    """Per-key (API key or tenant) limits on requests/minute and tokens/minute.

    Tokens charged per request = prompt tokens + its max_tokens reserve, since the output
    length is unknown up front; `refund` returns the unused reserve when the request ends.
    Each limit allows a burst of one minute's worth. Memory is bounded: idle keys are
    forgotten and at most `max_keys` are kept (least recently used evicted first).
    """

    def __init__(
        self,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        *,
        max_keys: int = 10_000,
    ) -> None:
        for name, value in (
            ("requests_per_minute", requests_per_minute),
            ("tokens_per_minute", tokens_per_minute),
            ("max_keys", max_keys),
        ):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.max_keys = max_keys
        self._keys: OrderedDict[str, _KeyBuckets] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None

    def __len__(self) -> int:
        return len(self._keys)

    def _new_buckets(self) -> _KeyBuckets:
        rpm, tpm = self.requests_per_minute, self.tokens_per_minute
        return _KeyBuckets(
            requests=None if rpm is None else TokenBucket(rpm / 60.0, rpm),
            tokens=None if tpm is None else TokenBucket(tpm / 60.0, tpm),
        )

    def _buckets(self, key: str, now_s: float) -> _KeyBuckets:
        buckets = self._keys.get(key)
        if buckets is None:
            self._evict(now_s)
            buckets = self._keys[key] = self._new_buckets()
        else:
            self._keys.move_to_end(key)
        return buckets

    def _evict(self, now_s: float) -> None:
        # Amortised O(1): drop a couple of idle keys from the cold end on each new key...
        for _ in range(2):
            if not self._keys:
                break
            oldest_key, oldest = next(iter(self._keys.items()))
            if not oldest.is_idle(now_s):
                break
            del self._keys[oldest_key]
        # ...and never exceed the cap, even if the coldest key is still throttled.
        while len(self._keys) >= self.max_keys:
            self._keys.popitem(last=False)

    def check(self, key: str, num_tokens: int, now_s: float) -> float:
        """0.0: allowed, and both limits charged; > 0: seconds to wait, nothing charged."""
        if not self.enabled:
            return 0.0
        b = self._buckets(key, now_s)
        wait = max(
            0.0 if b.requests is None else b.requests.wait_s(1, now_s),
            0.0 if b.tokens is None else b.tokens.wait_s(num_tokens, now_s),
        )
        if wait > 0.0:
            return wait
        if b.requests is not None:
            b.requests.take(1, now_s)
        if b.tokens is not None:
            b.tokens.take(num_tokens, now_s)
        return 0.0

    def refund(self, key: str, num_tokens: int, now_s: float) -> None:
        """Give back tokens charged by `check` but not used (e.g. max_tokens not generated)."""
        b = self._keys.get(key)
        if b is not None and b.tokens is not None and num_tokens > 0:
            b.tokens.give_back(num_tokens, now_s)
