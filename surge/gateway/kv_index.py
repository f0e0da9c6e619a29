"""KvIndex: the block hashes each replica reports holding, from its KV events.

Per replica, a set of block hashes and the sequence number of the last batch applied. Events
lost or out of order make the set unknowable, so the replica's entries are dropped rather than
trusted: a batch whose sequence number is not the next one (a gap: the publisher dropped, or
it restarted and counts from 0 again), AllBlocksCleared, the connection going away (the
subscriber's monitor), the replica leaving the pool. A dropped replica holds nothing until new
BlockStored events arrive, so the index may under-report a cache (routing loses a hit) but
never claims a block that was evicted while nobody listened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from surge.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


@dataclass
class ReplicaBlocks:
    hashes: set[bytes] = field(default_factory=set)
    block_size: int | None = None  # from its advertisement or its BlockStored events
    last_seq: int | None = None  # None: nothing applied since the last drop


class KvIndex:
    def __init__(self) -> None:
        self._replicas: dict[str, ReplicaBlocks] = {}
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
            elif isinstance(event, BlockRemoved):
                r.hashes.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                if r.hashes:
                    self.drop(url, "cleared")
                r.last_seq = seq

    def matched(self, url: str, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of a prompt (its chained hashes) `url` holds."""
        r = self._replicas.get(url)
        if r is None or not r.hashes:
            return 0
        held = r.hashes
        n = 0
        for h in hashes:
            if h not in held:
                break
            n += 1
        return n
