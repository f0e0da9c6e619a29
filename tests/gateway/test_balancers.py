"""Balancers on plain snapshots: the spread of many picks, counted."""

from __future__ import annotations

import random
from collections import Counter

from surge.gateway.balancers import (
    ConsistentHash,
    LeastOutstanding,
    PowerOfTwo,
    PrefixAware,
    RoundRobin,
    WeightedRoundRobin,
    make_balancer,
)
from surge.gateway.config import Policy, PrefixConfig
from surge.gateway.upstreams import RouteKey, UpstreamSnapshot

A, B, C, D = (f"http://10.0.0.{i}:8000" for i in range(1, 5))
NO_KEY = RouteKey()


def snaps(*urls: str) -> list[UpstreamSnapshot]:
    return [UpstreamSnapshot(url=u) for u in urls]


def test_every_policy_returns_none_without_candidates() -> None:
    for policy in Policy:
        assert make_balancer(policy, PrefixConfig(), random.Random(0)).pick([], NO_KEY) is None


def test_round_robin_is_even() -> None:
    rr = RoundRobin()
    cands = snaps(A, B, C)
    counts = Counter(rr.pick(cands, NO_KEY) for _ in range(300))
    assert counts == {A: 100, B: 100, C: 100}


def test_weighted_round_robin_follows_weights_smoothly() -> None:
    wrr = WeightedRoundRobin()
    cands = [UpstreamSnapshot(A, weight=3), UpstreamSnapshot(B, weight=1)]
    picks = [wrr.pick(cands, NO_KEY) for _ in range(400)]
    assert Counter(picks) == {A: 300, B: 100}
    # Smooth: never four A's in a row (plain weighted RR would send A, A, A, then B).
    assert all(picks[i : i + 4] != [A] * 4 for i in range(len(picks) - 3))


def test_weighted_round_robin_5_1_1_is_nginx_sequence() -> None:
    wrr = WeightedRoundRobin()
    cands = [UpstreamSnapshot(A, weight=5), UpstreamSnapshot(B), UpstreamSnapshot(C)]
    assert [wrr.pick(cands, NO_KEY) for _ in range(7)] == [A, A, B, A, C, A, A]


def test_least_outstanding_picks_the_minimum_and_rotates_ties() -> None:
    lo = LeastOutstanding()
    cands = [UpstreamSnapshot(A, in_flight=5), UpstreamSnapshot(B, in_flight=1),
             UpstreamSnapshot(C, in_flight=3)]  # fmt: skip
    assert {lo.pick(cands, NO_KEY) for _ in range(20)} == {B}
    ties = [UpstreamSnapshot(A, in_flight=2), UpstreamSnapshot(B, in_flight=2)]
    assert Counter(lo.pick(ties, NO_KEY) for _ in range(100)) == {A: 50, B: 50}


def test_least_outstanding_counts_scraped_load_and_weight() -> None:
    lo = LeastOutstanding()
    busy_elsewhere = UpstreamSnapshot(A, in_flight=0, num_waiting=7, num_running=2)
    heavy = UpstreamSnapshot(B, in_flight=4, weight=4)  # 1 per unit of weight
    assert lo.pick([busy_elsewhere, heavy], NO_KEY) == B


def test_power_of_two_prefers_the_less_loaded() -> None:
    p2c = PowerOfTwo(random.Random(1))
    cands = [UpstreamSnapshot(A, in_flight=0), UpstreamSnapshot(B, in_flight=10),
             UpstreamSnapshot(C, in_flight=10)]  # fmt: skip
    counts = Counter(p2c.pick(cands, NO_KEY) for _ in range(3000))
    # A wins every draw it is in: 2 of the 3 pairs.
    assert 0.6 < counts[A] / 3000 < 0.73
    assert counts[B] > 300 and counts[C] > 300
    assert p2c.pick([UpstreamSnapshot(D)], NO_KEY) == D


def test_consistent_hash_keeps_sessions_and_moves_few_keys() -> None:
    ring = ConsistentHash()
    keys = [RouteKey(session=f"user-{i}") for i in range(4000)]
    four = [UpstreamSnapshot(u) for u in (A, B, C, D)]
    before = {k: ring.pick(four, k) for k in keys}
    assert {k: ring.pick(four, k) for k in keys} == before  # sticky
    spread = Counter(before.values())
    assert all(800 < n < 1200 for n in spread.values()), spread
    # Add a fifth upstream: about 1/5 of the keys move, all of them to the new one.
    e = "http://10.0.0.5:8000"
    after = {k: ring.pick([*four, UpstreamSnapshot(e)], k) for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    assert 0.12 < len(moved) / len(keys) < 0.28
    assert {after[k] for k in moved} == {e}
    # Remove one: only its keys move (about 1/4), and they spread over the others.
    three = [s for s in four if s.url != B]
    removed = {k: ring.pick(three, k) for k in keys}
    moved = [k for k in keys if removed[k] != before[k]]
    assert {before[k] for k in moved} == {B}
    assert len({removed[k] for k in moved}) == 3


def test_consistent_hash_without_session_balances_by_load() -> None:
    ring = ConsistentHash()
    cands = [UpstreamSnapshot(A, in_flight=3), UpstreamSnapshot(B, in_flight=0)]
    assert ring.pick(cands, NO_KEY) == B


def test_prefix_aware_same_prefix_same_upstream() -> None:
    pa = PrefixAware(PrefixConfig())
    cands = [UpstreamSnapshot(u) for u in (A, B, C)]
    shared = (11, 22, 33)
    first = pa.pick(cands, RouteKey(prefix_hashes=(*shared, 1)))
    # Loads shift a little; the prompts sharing the prefix still follow it.
    busy = [UpstreamSnapshot(u, in_flight=2 if u == first else 0) for u in (A, B, C)]
    for tail in range(2, 30):
        assert pa.pick(busy, RouteKey(prefix_hashes=(*shared, tail))) == first


def test_prefix_aware_longest_match_wins() -> None:
    pa = PrefixAware(PrefixConfig())
    pa.affinity.record((1, 2, 3, 4), B)
    pa.affinity.record((1, 2), A)  # later, a shorter prompt went to A: A holds (1, 2) too
    every = {A, B, C}
    assert pa.affinity.match((1, 2, 3, 4, 5), every) == (B, 4)
    assert pa.affinity.match((1, 2, 9), every) == (A, 2)
    assert pa.affinity.match((1, 2, 3, 4), {A, C}) == (A, 2)  # B down or tried: next longest
    assert pa.affinity.match((5, 6), every) == (None, 0)
    cands = [UpstreamSnapshot(u) for u in (A, B, C)]
    assert pa.pick(cands, RouteKey(prefix_hashes=(1, 2, 3, 4, 5))) == B
    assert pa.affinity.match((1, 2, 3, 4, 5), every) == (B, 5)  # the pick taught it


def test_prefix_aware_falls_back_when_the_cached_upstream_is_overloaded() -> None:
    cfg = PrefixConfig(balance_abs=4, balance_rel=1.5)
    pa = PrefixAware(cfg)
    key = RouteKey(prefix_hashes=(7, 8, 9))
    pa.affinity.record(key.prefix_hashes, A)
    # Over by 4 (not more than balance_abs): stays.
    assert pa.pick([UpstreamSnapshot(A, in_flight=6), UpstreamSnapshot(B, in_flight=2)], key) == A
    # Over by 5 and more than 1.5x: least loaded wins, and the prefix now lives there.
    assert pa.pick([UpstreamSnapshot(A, in_flight=7), UpstreamSnapshot(B, in_flight=2)], key) == B
    assert pa.pick([UpstreamSnapshot(A), UpstreamSnapshot(B)], key) == B
    # Over by a lot in absolute terms but not relatively (both busy): stays.
    pa.affinity.record(key.prefix_hashes, A)
    assert pa.pick([UpstreamSnapshot(A, in_flight=40), UpstreamSnapshot(B, in_flight=30)], key) == A


def test_prefix_aware_spreads_new_prefixes_over_an_idle_fleet() -> None:
    pa = PrefixAware(PrefixConfig())
    cands = [UpstreamSnapshot(u) for u in (A, B, C)]
    counts = Counter(pa.pick(cands, RouteKey(prefix_hashes=(i,))) for i in range(300))
    assert all(60 < n < 140 for n in counts.values()), counts
    # No prompt hashes (shorter than a chunk): rotate.
    assert Counter(pa.pick(cands, NO_KEY) for _ in range(30)) == {A: 10, B: 10, C: 10}
