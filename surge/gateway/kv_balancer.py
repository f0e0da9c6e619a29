"""KvAware: send a request to the replica that really holds the longest prefix of it.

Where the prefix policy guesses from where it sent text before, this one asks the KvIndex
(built from the replicas' own KV events) how many leading blocks of the request's tokens each
candidate holds. Load is weighed as the prefix policy weighs it (SGLang's balance thresholds):
a candidate whose load exceeds the least loaded one's by more than `balance_abs` AND by more
than `balance_rel` times is passed over; among the rest the longest match wins, equal matches
go to the less loaded. With no match anywhere (or no tokens), the least loaded candidate wins,
ties split by the prompt's first 64 tokens so equal prefixes meet on one replica. The chosen
replica is then credited with the prompt's blocks (the index's routed claims) until its own
events confirm or deny them, so the same new prefix sent again meanwhile follows.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from surge.gateway.config import PrefixConfig
from surge.gateway.kv_index import KvIndex
from surge.gateway.upstreams import RouteKey, UpstreamSnapshot
from surge.kv_events.hashing import block_hashes

START_TOKENS = 64


class KvAware:
    def __init__(self, config: PrefixConfig, index: KvIndex) -> None:
        self.config = config
        self.index = index
        self._next = 0  # ties' rotation, for requests with no tokens

    def pick(self, candidates: Sequence[UpstreamSnapshot], key: RouteKey) -> str | None:
        if not candidates:
            return None
        tokens = key.prompt_tokens
        if tokens is None:
            return self._least_loaded(candidates, None, "").url
        salt = key.cache_salt.encode()
        by_size: dict[int, list[bytes]] = {}  # replicas' block sizes may differ
        matched: dict[str, int] = {}
        for c in candidates:
            size = self.index.block_size(c.url)
            if size is None:
                continue
            hashes = by_size.get(size)
            if hashes is None:
                hashes = by_size[size] = block_hashes(tokens, size, salt)
            matched[c.url] = self.index.matched(c.url, hashes) * size
        least = self._least_loaded(candidates, tokens, key.cache_salt)
        best: UpstreamSnapshot | None = None
        for c in candidates:
            n = matched.get(c.url, 0)
            if n == 0 or self._imbalanced(c, least):
                continue
            if best is None or (n, -per_weight(c)) > (matched[best.url], -per_weight(best)):
                best = c
        chosen = best or least
        size = self.index.block_size(chosen.url)
        if size is not None and (hashes := by_size.get(size)):
            self.index.claim(chosen.url, hashes)  # held there soon: its prefill stores them
        return chosen.url

    def _least_loaded(
        self, candidates: Sequence[UpstreamSnapshot], tokens: Sequence[int] | None, salt: str
    ) -> UpstreamSnapshot:
        low = min(per_weight(c) for c in candidates)
        ties = [c for c in candidates if per_weight(c) == low]
        if len(ties) == 1:
            return ties[0]
        if tokens is None:
            self._next += 1
            return ties[self._next % len(ties)]
        start = _start_key(tokens, salt)
        return max(ties, key=lambda c: hashlib.blake2b(start + c.url.encode()).digest())

    def _imbalanced(self, cached: UpstreamSnapshot, least: UpstreamSnapshot) -> bool:
        a, b = per_weight(cached), per_weight(least)
        return a - b > self.config.balance_abs and a > self.config.balance_rel * b


def per_weight(c: UpstreamSnapshot) -> float:
    return c.load / c.weight


def _start_key(tokens: Sequence[int], salt: str) -> bytes:
    """The prompt's start, for rendezvous hashing among equally loaded candidates: 64 tokens
    (about the prefix policy's 256-character chunk), so prompts that share only a template's
    opening or a short common preamble still spread, and those sharing more meet."""
    return salt.encode() + b"\x00" + array("q", tokens[:START_TOKENS]).tobytes()
