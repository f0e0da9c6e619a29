"""Token-bucket math on a driven clock; per-key limits, atomic charging, bounded memory."""

from __future__ import annotations

import pytest

from surge.server.rate_limit import RateLimiter, TokenBucket


def test_bucket_starts_full_and_allows_a_burst() -> None:
    b = TokenBucket(rate_per_s=2.0, burst=4.0)
    assert [b.try_take(1, now_s=100.0) for _ in range(4)] == [0.0] * 4
    assert b.try_take(1, now_s=100.0) == 0.5  # 1 token at 2/s
    assert b.tokens(100.0) == 0.0  # a refusal takes nothing


def test_bucket_refills_at_rate_capped_at_burst() -> None:
    b = TokenBucket(rate_per_s=1.0, burst=5.0)
    assert b.try_take(5, 0.0) == 0.0
    assert b.try_take(3, 0.5) == 2.5  # has 0.5, needs 3
    assert b.try_take(3, 2.0) == 1.0  # has 2.0
    assert b.try_take(3, 3.0) == 0.0
    assert b.tokens(1000.0) == 5.0  # refill stops at burst


def test_retry_after_is_exact_when_waited() -> None:
    b = TokenBucket(rate_per_s=0.25, burst=2.0)
    b.try_take(2, 10.0)
    wait = b.try_take(1, 10.0)
    assert wait == 4.0
    assert b.try_take(1, 10.0 + wait - 0.5) > 0.0
    assert b.try_take(1, 10.0 + wait) == 0.0


def test_oversize_take_only_when_full_then_debt() -> None:
    b = TokenBucket(rate_per_s=1.0, burst=10.0)
    assert b.try_take(25, 0.0) == 0.0  # full bucket: allowed, 15 in debt
    assert b.tokens(0.0) == -15.0
    assert b.try_take(25, 0.0) == 25.0  # must refill to full (10) from -15
    assert b.try_take(1, 16.0) == 0.0


def test_give_back_and_backwards_clock() -> None:
    b = TokenBucket(rate_per_s=1.0, burst=3.0)
    b.try_take(3, 5.0)
    b.give_back(2, 5.0)
    assert b.tokens(5.0) == 2.0
    b.give_back(10, 5.0)
    assert b.tokens(5.0) == 3.0
    b.try_take(3, 5.0)
    assert b.tokens(4.0) == 0.0  # earlier time: no refill, no loss
    assert b.tokens(6.0) == 1.0


def test_bucket_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="rate_per_s"):
        TokenBucket(0.0, 1.0)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(1.0, float("inf"))


def test_limiter_requests_per_minute_per_key() -> None:
    rl = RateLimiter(requests_per_minute=2, tokens_per_minute=None)
    assert rl.check("a", 0, 0.0) == 0.0
    assert rl.check("a", 0, 0.0) == 0.0
    assert rl.check("a", 0, 0.0) == 30.0  # 1 request refills in 60/2 s
    assert rl.check("b", 0, 0.0) == 0.0  # other keys are unaffected
    assert rl.check("a", 0, 30.0) == 0.0


def test_limiter_charges_both_buckets_atomically() -> None:
    rl = RateLimiter(requests_per_minute=10, tokens_per_minute=600)  # 10 tokens/s
    assert rl.check("k", 500, 0.0) == 0.0
    assert rl.check("k", 200, 0.0) == 10.0  # 100 left, needs 200
    # The refusal charged no request slot: 9 requests remain.
    assert [rl.check("k", 0, 0.0) for _ in range(9)] == [0.0] * 9
    assert rl.check("k", 0, 0.0) == 6.0  # request bucket now empty: 1 per 6 s
    rl.refund("k", 100, 0.0)
    assert rl.check("k", 200, 6.0) == 0.0  # 100 left + 100 refunded + 60 refilled


def test_limiter_disabled_allows_everything_and_keeps_nothing() -> None:
    rl = RateLimiter(None, None)
    assert not rl.enabled
    assert all(rl.check(str(i), 10**9, 0.0) == 0.0 for i in range(100))
    assert len(rl) == 0


def test_limiter_memory_is_bounded_by_lru_cap() -> None:
    rl = RateLimiter(requests_per_minute=1, tokens_per_minute=None, max_keys=100)
    for i in range(1000):
        rl.check(f"k{i}", 0, 0.0)  # all throttled (not idle), so only the cap bounds them
    assert len(rl) == 100
    assert rl.check("k999", 0, 0.0) > 0.0  # the most recent keys keep their state


def test_limiter_forgets_idle_keys() -> None:
    rl = RateLimiter(requests_per_minute=60, tokens_per_minute=None)
    for i in range(50):
        rl.check(f"k{i}", 0, float(i))
    # Each key refills within 1 s, so new keys sweep away the idle ones at the cold end.
    assert len(rl) < 5


def test_limiter_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="tokens_per_minute"):
        RateLimiter(requests_per_minute=None, tokens_per_minute=0)
