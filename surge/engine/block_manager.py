"""Paged KV-cache block bookkeeping with automatic prefix caching (ids only, no tensors).

Every block is either referenced by at least one request's block table (ref > 0) or free
(ref == 0, in the free queue). A free block may still hold cached content (a hash in the
prefix index): it can be revived by a prefix hit until it is popped for reuse, which is the
one place where its hash is dropped. Free queue order is the eviction order:
uncached blocks at the front (nothing to lose), cached blocks behind them in LRU order.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence


class BlockManager:
    """Owns the block tables (keyed by req_id), ref counts, free queue and prefix index."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"need num_blocks > 0 and block_size > 0, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref: list[int] = [0] * num_blocks
        # Hash and token ids of a registered block; both None when the block holds no
        # cached content. The token ids let a hash hit be verified before it is served.
        self._hash: list[bytes | None] = [None] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._index: dict[bytes, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._tables: dict[str, list[int]] = {}
        # Blocks of each table already considered by cache_full_blocks, so that each call
        # only looks at newly computed blocks (O(new) per step, not O(table)).
        self._num_considered: dict[str, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ----------------------------------------------------------------- queries

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0: never used, freed, or cached but evictable."""
        return len(self._free)

    def usage(self) -> float:
        """Fraction of blocks referenced by some request (0.0 when no request holds any)."""
        return (self.num_blocks - len(self._free)) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks the prefix cache can find by hash (held by a request or free to evict)."""
        return len(self._index)

    def free_block_ids(self) -> list[int]:
        """The free queue, front (next to be reused/evicted) first. For tests and debugging."""
        return list(self._free)

    def block_table(self, req_id: str) -> list[int]:
        """A copy of req's block table. KeyError if req has none."""
        return list(self._tables[req_id])

    def has(self, req_id: str) -> bool:
        """Whether req currently holds a block table."""
        return req_id in self._tables

    def lookup_prefix(self, token_ids: Sequence[int], block_hashes: Sequence[bytes]) -> int:
        """Number of prompt tokens (a multiple of block_size) the cache can serve; no side effects.

        Never covers the last token (it must be computed to get logits); 0 when prefix
        caching is off.
        """
        return len(self._match(token_ids, block_hashes)) * self.block_size

    def _match(self, token_ids: Sequence[int], block_hashes: Sequence[bytes]) -> list[int]:
        """Cached blocks serving the longest prefix of token_ids, each hit verified by content."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        max_blocks = min(len(block_hashes), max(0, (len(token_ids) - 1) // bs))
        hits: list[int] = []
        seen: set[int] = set()  # a forged hash list could name the same block twice
        for i in range(max_blocks):
            block = self._index.get(block_hashes[i])
            if block is None or block in seen:
                break
            if self._tokens[block] != tuple(token_ids[i * bs : (i + 1) * bs]):
                break  # hash collision or forged hash: never serve different tokens
            hits.append(block)
            seen.add(block)
        return hits

    # ----------------------------------------------------------------- updates

    def allocate_slots(
        self,
        req_id: str,
        num_tokens: int,
        token_ids: Sequence[int] = (),
        block_hashes: Sequence[bytes] = (),
    ) -> int | None:
        """Make req's block table cover token positions [0, num_tokens).

        On req's first call (no table yet) with prefix caching on, the cached prefix of
        token_ids is reused first (as lookup_prefix) and its length in tokens is returned;
        later calls return 0, as does num_tokens <= current coverage (a no-op). Returns None
        and changes nothing if there are not enough free blocks.
        """
        table = self._tables.get(req_id)
        hits = self._match(token_ids, block_hashes) if table is None else []
        have = len(hits) if table is None else len(table)
        need = max(0, -(-num_tokens // self.block_size) - have)
        # Evictable hit blocks leave the free queue, so they can't also serve as new blocks.
        revived = sum(1 for b in hits if self._ref[b] == 0)
        if need > len(self._free) - revived:
            return None

        if table is None:
            table = self._tables[req_id] = []
            self._num_considered[req_id] = 0
            if self.enable_prefix_caching:
                self.prefix_cache_queries += len(token_ids)
                self.prefix_cache_hits += len(hits) * self.block_size
        for b in hits:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
            table.append(b)
        for _ in range(need):
            b = self._pop_free()
            self._ref[b] = 1
            table.append(b)
        return len(hits) * self.block_size

    def _pop_free(self) -> int:
        """Take the front free block for reuse, evicting its cached content if any.

        The ONLY place a block loses its hash while it may be reused, so a reused block can
        never keep a stale index entry.
        """
        block, _ = self._free.popitem(last=False)
        old = self._hash[block]
        if old is not None:
            del self._index[old]
            self._hash[block] = None
            self._tokens[block] = None
        return block

    def fork(self, src_req_id: str, dst_req_id: str, num_blocks: int) -> None:
        """Start dst's table with src's first num_blocks blocks, shared (ref += 1).

        dst must have no table yet. The caller shares only blocks neither request will write
        again (full prompt blocks); a partial last block must be allocated fresh for dst.
        """
        if dst_req_id in self._tables:
            raise ValueError(f"fork: {dst_req_id!r} already has a block table")
        src = self._tables[src_req_id]
        if not 0 <= num_blocks <= len(src):
            raise ValueError(f"fork: num_blocks={num_blocks} outside [0, {len(src)}]")
        shared = src[:num_blocks]
        for b in shared:
            self._ref[b] += 1  # src holds them, so none of them is in the free queue
        self._tables[dst_req_id] = shared
        self._num_considered[dst_req_id] = 0

    def cache_full_blocks(
        self,
        req_id: str,
        token_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        num_computed_tokens: int,
    ) -> None:
        """Register in the prefix index req's blocks that are now full and computed.

        Block i qualifies when (i+1)*block_size <= num_computed_tokens and i < len(block_hashes).
        A block whose hash already maps to another block (same content computed twice
        concurrently) stays unregistered and is freed normally later. No-op when prefix
        caching is off. KeyError if req has no table.
        """
        if not self.enable_prefix_caching:
            return
        table = self._tables[req_id]
        bs = self.block_size
        end = min(num_computed_tokens // bs, len(block_hashes), len(table), len(token_ids) // bs)
        start = self._num_considered[req_id]
        for i in range(start, end):
            block = table[i]
            h = block_hashes[i]
            if self._hash[block] is not None or h in self._index:
                continue  # already cached (prefix hit, fork) or a duplicate of another block
            self._hash[block] = h
            self._tokens[block] = tuple(token_ids[i * bs : (i + 1) * bs])
            self._index[h] = block
        self._num_considered[req_id] = max(start, end)

    def free(self, req_id: str) -> None:
        """Drop req's table (unknown req_id: no-op) and release its blocks.

        A block reaching ref 0 without a hash goes to the FRONT of the free queue (reuse it
        first); with a hash it stays cached and goes to the BACK (LRU). Blocks are released
        last-first so a request's tail blocks, the least likely to be shared, are evicted
        before its head blocks.
        """
        table = self._tables.pop(req_id, None)
        if table is None:
            return
        del self._num_considered[req_id]
        for b in reversed(table):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                if self._hash[b] is None:
                    self._free.move_to_end(b, last=False)

    def reset_prefix_cache(self) -> bool:
        """Forget all cached content. False (and no change) if a cached block is referenced.

        The hit/query counters are left alone: they are monotonic metrics.
        """
        if any(self._ref[b] > 0 for b in self._index.values()):
            return False
        for b in self._index.values():
            self._hash[b] = None
            self._tokens[b] = None
        self._index.clear()
        return True

    # ----------------------------------------------------------------- checks

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (for tests)."""
        holders = Counter(b for table in self._tables.values() for b in table)
        _check(set(self._num_considered) == set(self._tables), "progress keys != table keys")
        _check(all(0 <= b < self.num_blocks for b in self._free), "free id out of range")
        for b in range(self.num_blocks):
            _check(self._ref[b] == holders[b], f"block {b}: ref {self._ref[b]} != {holders[b]}")
            _check((self._ref[b] == 0) == (b in self._free), f"block {b}: not free xor used")
            h = self._hash[b]
            _check((h is None) == (self._tokens[b] is None), f"block {b}: hash/tokens mismatch")
            if h is not None:
                _check(self._index.get(h) == b, f"block {b}: stale hash not in index")
                tokens = self._tokens[b]
                _check(tokens is not None and len(tokens) == self.block_size, "bad tokens")
        for h, b in self._index.items():
            _check(self._hash[b] == h, f"index entry for block {b} != its stored hash")


def _check(cond: bool, msg: str) -> None:
    # Not `assert`: the checks must run under `python -O` too.
    if not cond:
        raise AssertionError(msg)
