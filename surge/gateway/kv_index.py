"""KvIndex: the block hashes each replica reports holding, from its KV events.

Per replica, a set of block hashes and the sequence number of the last batch applied. Events
lost or out of order make the set unknowable, so the replica's entries are dropped rather than
trusted: a batch whose sequence number is not the next one (a gap: the publisher dropped, or
it restarted and counts from 0 again), AllBlocksCleared, the connection going away (the
subscriber's monitor), the replica leaving the pool. A dropped replica holds nothing until new
BlockStored events arrive, so the index may under-report a cache (routing loses a hit) but
never claims a block that was evicted while nobody listened.

Routed claims fill the gap between a pick and the events of what it stores: the prefill takes
a while (seconds on a busy CPU), and until its BlockStored arrive, every other request with
the same new prefix (a tenant's next conversations, sent at once) would find it nowhere and
go by load, scattering the prefix. So the policy notes the blocks of each prompt it routes as
claimed by that replica for `routed_ttl_s`; a claim counts as held until it expires, the
replica's events store the block (a fact now) or remove it, or the replica is dropped.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from surge.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


@dataclass
class ReplicaBlocks:
    hashes: set[bytes] = field(default_factory=set)
    block_size: int | None = None  # from its advertisement or its BlockStored events
    last_seq: int | None = None  # None: nothing applied since the last drop
    claimed: dict[bytes, float] = field(default_factory=dict)  # routed, not confirmed: expiry


MAX_CLAIMS = 4096  # routed prompts whose claims are kept at most (the oldest go first)


class KvIndex:
    def __init__(
        self, routed_ttl_s: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._replicas: dict[str, ReplicaBlocks] = {}
        self.routed_ttl_s = routed_ttl_s
        self.clock = clock
        self._claims: deque[tuple[float, str, Sequence[bytes]]] = deque()  # by expiry
        # (url, reason) for each drop: the subscriber counts them in its metrics
        self.on_drop: Callable[[str, str], None] | None = None

    def urls(self) -> list[str]:
        return list(self._replicas)

    def blocks(self, url: str) -> int:
        r = self._replicas.get(url)
        return len(r.hashes) if r is not None else 0

    def block_size(self, url: str) -> int | None:
        r = self._replicas.get(url)
        return r.block_size if r is not None else None

    def last_seq(self, url: str) -> int | None:
        r = self._replicas.get(url)
        return r.last_seq if r is not None else None

    def set_block_size(self, url: str, block_size: int) -> None:
        self._replicas.setdefault(url, ReplicaBlocks()).block_size = block_size

    def drop(self, url: str, reason: str) -> None:
        """Forget what `url` holds (its next batch starts a fresh count)."""
        r = self._replicas.get(url)
        if r is None:
            return
        had = bool(r.hashes) or r.last_seq is not None
        r.hashes.clear()
        r.claimed.clear()
        r.last_seq = None
        if had and self.on_drop is not None:
            self.on_drop(url, reason)

    def forget(self, url: str) -> None:
        """The replica left the pool."""
        self._replicas.pop(url, None)

    def apply(self, url: str, seq: int, batch: KVEventBatch) -> None:
        """One published batch; a sequence number that does not follow drops the replica's
        entries first (what happened in between is unknown)."""
        r = self._replicas.setdefault(url, ReplicaBlocks())
        if r.last_seq is not None and seq != r.last_seq + 1:
            self.drop(url, "restart" if seq <= r.last_seq else "gap")
        r.last_seq = seq
        for event in batch.events:
            if isinstance(event, BlockStored):
                r.hashes.update(event.block_hashes)
                r.block_size = event.block_size
                if r.claimed:
                    for h in event.block_hashes:
                        r.claimed.pop(h, None)
            elif isinstance(event, BlockRemoved):
                r.hashes.difference_update(event.block_hashes)
                if r.claimed:
                    for h in event.block_hashes:
                        r.claimed.pop(h, None)
            elif isinstance(event, AllBlocksCleared):
                if r.hashes:
                    self.drop(url, "cleared")
                r.claimed.clear()
                r.last_seq = seq

    def claim(self, url: str, hashes: Sequence[bytes]) -> None:
        """A prompt with these block hashes was just routed to `url`: count them as held there
        until its events say otherwise or `routed_ttl_s` passes (0: no claims)."""
        r = self._replicas.get(url)
        if self.routed_ttl_s <= 0 or r is None or not hashes:
            return
        now = self.clock()
        self._expire(now)
        until = now + self.routed_ttl_s
        for h in hashes:
            if h not in r.hashes:
                r.claimed[h] = until
        self._claims.append((until, url, hashes))
        if len(self._claims) > MAX_CLAIMS:
            self._release(*self._claims.popleft())

    def _expire(self, now: float) -> None:
        claims = self._claims
        while claims and claims[0][0] <= now:
            self._release(*claims.popleft())

    def _release(self, until: float, url: str, hashes: Sequence[bytes]) -> None:
        r = self._replicas.get(url)
        if r is None or not r.claimed:
            return
        for h in hashes:
            if r.claimed.get(h) == until:  # not claimed again since
                del r.claimed[h]

    def matched(self, url: str, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of a prompt (its chained hashes) `url` holds (or has been
        sent and not yet confirmed: claims)."""
        r = self._replicas.get(url)
        if r is None:
            return 0
        held, claimed = r.hashes, r.claimed
        if claimed and self._claims:
            self._expire(self.clock())
        n = 0
        for h in hashes:
            if h not in held and h not in claimed:
                break
            n += 1
        return n
