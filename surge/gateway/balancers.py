"""Routing policies: each picks one upstream from snapshots of the candidates.

Balancers do no I/O and read no clock: what they know comes in as arguments (their own
memory, such as a round-robin position or the prefix LRU, is the only state they keep).
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from surge.gateway.config import Policy, PrefixConfig
from surge.gateway.kv_balancer import KvAware
from surge.gateway.kv_index import KvIndex
from surge.gateway.prefix_affinity import PrefixAffinity
from surge.gateway.upstreams import RouteKey, UpstreamSnapshot


class Balancer(Protocol):
    def pick(self, candidates: Sequence[UpstreamSnapshot], key: RouteKey) -> str | None:
        """Return the url of one of `candidates`, or None when there are none.

        Candidates are the upstreams a request may go to now (healthy, circuit admits, not
        yet tried by this request), in a stable order. A balancer must not return anything
        else, and may remember its choice (the prefix balancer learns from it).
        """
        ...


def _hash64(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "little")


def _per_weight(c: UpstreamSnapshot) -> float:
    return c.load / c.weight


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[UpstreamSnapshot], key: RouteKey) -> str | None:
        if not candidates:
            return None
        c = candidates[self._next % len(candidates)]
        self._next += 1
        return c.url


class WeightedRoundRobin:
    """nginx's smooth weighted round robin: weights 5:1:1 give a a b a c a a, not a a a a a b c.

    Each pick adds every candidate's weight to its running score, takes the highest and
    subtracts the total weight from it.
    """

    def __init__(self) -> None:
        self._score: dict[str, float] = {}

    def pick(self, candidates: Sequence[UpstreamSnapshot], key: RouteKey) -> str | None:
        if not candidates:
            return None
        if len(self._score) > 2 * len(candidates) + 16:  # forget upstreams long gone
            live = {c.url for c in candidates}
            self._score = {u: s for u, s in self._score.items() if u in live}
        total = 0.0
        best: UpstreamSnapshot | None = None
        for c in candidates:
            score = self._score.get(c.url, 0.0) + c.weight
            self._score[c.url] = score
            total += c.weight
            if best is None or score > self._score[best.url]:
                best = c
        assert best is not None
        self._score[best.url] -= total
        return best.url


class LeastOutstanding:
    """Fewest outstanding requests per unit of weight; ties rotate."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, candidates: Sequence[UpstreamSnapshot], key: RouteKey) -> str | None:
        if not candidates:
            return None
        low = min(_per_weight(c) for c in candidates)
        ties = [c for c in candidates if _per_weight(c) == low]
        self._next += 1
        return ties[self._next % len(ties)].url


class PowerOfTwo:
    """Two candidates at random, the less loaded wins: near least-loaded without herding every
    request onto the one upstream that looked idlest in a stale snapshot."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, candidates: Sequence[UpstreamSnapshot], key: RouteKey) -> str | None:
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0].url
        a, b = self._rng.sample(list(candidates), 2)
        return (b if _per_weight(b) < _per_weight(a) else a).url


class HashRing:
    """Consistent hash ring with virtual nodes (more for heavier upstreams)."""

    def __init__(self, nodes: Sequence[tuple[str, float]], vnodes: int) -> None:
        points = sorted(
            (_hash64(f"{url}#{i}"), url)
            for url, weight in nodes
            for i in range(max(1, round(vnodes * weight)))
        )
        self._points = [p for p, _ in points]
        self._urls = [u for _, u in points]

    def lookup(self, key: str) -> str:
        i = bisect.bisect(self._points, _hash64(key)) % len(self._points)
        return self._urls[i]


class ConsistentHash:
    """Session affinity: a session key always lands on the same upstream while it is there;
    when upstreams join or leave, only about 1/N of the keys move. Requests without a
    session key are balanced by least outstanding."""

    MAX_RINGS = 8  # rings for recent candidate sets (all up, one excluded for a retry, ...)

    def __init__(self, vnodes: int = 160) -> None:
        self.vnodes = vnodes
        self._rings: OrderedDict[tuple[tuple[str, float], ...], HashRing] = OrderedDict()
        self._no_session = LeastOutstanding()

    def pick(self, candidates: Sequence[UpstreamSnapshot], key: RouteKey) -> str | None:
        if not candidates:
            return None
        if key.session is None:
            return self._no_session.pick(candidates, key)
        nodes = tuple(sorted((c.url, c.weight) for c in candidates))
        ring = self._rings.get(nodes)
        if ring is None:
            ring = self._rings[nodes] = HashRing(nodes, self.vnodes)
            if len(self._rings) > self.MAX_RINGS:
                self._rings.popitem(last=False)
        else:
            self._rings.move_to_end(nodes)
        return ring.lookup(key.session)


class PrefixAware:
    """Send a prompt where its longest prefix went before, unless that upstream is too busy.

    Too busy (SGLang's cache-aware router's balance thresholds): its load exceeds the least
    loaded candidate's by more than `balance_abs` AND by more than `balance_rel` times. Then,
    and for prompts with nothing remembered, the least loaded candidate wins; equal loads are
    split by the prompt's first chunk, so distinct prefixes spread out instead of all landing
    on the first upstream of an idle fleet.
    """

    def __init__(self, config: PrefixConfig) -> None:
        self.config = config
        self.affinity = PrefixAffinity(config.max_entries)
        self._next = 0

    def pick(self, candidates: Sequence[UpstreamSnapshot], key: RouteKey) -> str | None:
        if not candidates:
            return None
        hashes = key.prefix_hashes
        least = self._least_loaded(candidates, hashes[0] if hashes else None)
        if not hashes:
            return least.url
        chosen = least
        url, _ = self.affinity.match(hashes, {c.url for c in candidates})
        if url is not None:
            cached = next(c for c in candidates if c.url == url)
            if not self._imbalanced(cached, least):
                chosen = cached
        self.affinity.record(hashes, chosen.url)
        return chosen.url

    def _imbalanced(self, cached: UpstreamSnapshot, least: UpstreamSnapshot) -> bool:
        a, b = _per_weight(cached), _per_weight(least)
        return a - b > self.config.balance_abs and a > self.config.balance_rel * b

    def _least_loaded(
        self, candidates: Sequence[UpstreamSnapshot], first_hash: int | None
    ) -> UpstreamSnapshot:
        low = min(_per_weight(c) for c in candidates)
        ties = [c for c in candidates if _per_weight(c) == low]
        if len(ties) == 1:
            return ties[0]
        if first_hash is None:
            self._next += 1
            return ties[self._next % len(ties)]
        return max(ties, key=lambda c: _hash64(f"{c.url}#{first_hash}"))  # rendezvous hashing


def make_balancer(
    policy: Policy, prefix: PrefixConfig, rng: random.Random, kv_index: KvIndex | None = None
) -> Balancer:
    match policy:
        case Policy.ROUND_ROBIN:
            return RoundRobin()
        case Policy.WEIGHTED:
            return WeightedRoundRobin()
        case Policy.LEAST_OUTSTANDING:
            return LeastOutstanding()
        case Policy.POWER_OF_TWO:
            return PowerOfTwo(rng)
        case Policy.SESSION:
            return ConsistentHash()
        case Policy.PREFIX:
            return PrefixAware(prefix)
        case Policy.KV_AWARE:
            return KvAware(prefix, kv_index if kv_index is not None else KvIndex())
    raise ValueError(f"unknown policy {policy!r}")
