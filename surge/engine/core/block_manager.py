"""Paged KV-cache block bookkeeping with automatic prefix caching (ids only, no tensors).

Every block is either referenced by at least one request's block table (ref > 0) or free
(ref == 0, in the free queue). A free block may still hold cached content (a hash in the
prefix index): it can be revived by a prefix hit until it is popped for reuse, which is the
one place where its hash is dropped. Free queue order is the eviction order:
uncached blocks at the front (nothing to lose), cached blocks behind them in LRU order.

Partial-block reuse: past the last full-block hit, the cache may hold a block at the same
position, behind the same prefix, whose first tokens match the request's next ones: a full
cached block whose later tokens differ, or the computed part of a finished (or preempted)
request's last block. Those tokens' KV is copied into the request's own fresh block (the
copies are taken by the scheduler and run before the step's model), so a follow-up turn or a
resent prompt computes only what is new, not also up to block_size - 1 tokens of its tail.
Blocks are shared only when full and immutable; a partial one is never shared in place, since
its owner (or the next) writes its later positions.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

from surge.engine.stats import PrefixCacheStats
from surge.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

# The most donor blocks one partial lookup compares (the newest first): bounds the cost where
# thousands of conversations continue one shared prefix with the same token.
MAX_PARTIAL_CANDIDATES = 64


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
        # Donors for partial-block reuse, keyed by (the hash of the block before, first token):
        # full cached blocks past the first, and the computed first tokens of freed requests'
        # last blocks (`_partial`, fewer than block_size). The first block has no donors: its
        # parent would carry no cache salt.
        self._partial: list[tuple[int, ...] | None] = [None] * num_blocks
        self._donor_key: list[tuple[bytes, int] | None] = [None] * num_blocks
        self._donors: dict[tuple[bytes, int], dict[int, None]] = {}
        # (source, destination) blocks whose KV the next step copies first: take_copies().
        self._copies: list[tuple[int, int]] = []
        self.stats = PrefixCacheStats()  # its counters, since start
        # What entered and left the prefix cache since take_events(); None: nobody listens
        # (the default), and the hooks cost one attribute test.
        self._events: list[KVEvent] | None = None
        self._medium: str | None = None

    # ----------------------------------------------------------------- KV events

    def enable_events(self, medium: str | None = None) -> None:
        """Record BlockStored / BlockRemoved / AllBlocksCleared from now on (vLLM's KV events);
        `medium` is where the blocks live ("GPU", "CPU")."""
        self._events = []
        self._medium = medium

    def take_events(self) -> list[KVEvent]:
        """The events recorded since the last call, in order ([] when they are off)."""
        events = self._events
        if not events:
            return []
        self._events = []
        return events

    def _stored(
        self,
        first: int,
        last: int,
        token_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        lora_id: int | None,
    ) -> None:
        """Blocks first..last (positions in one request's table, a chain) were cached."""
        assert self._events is not None
        bs = self.block_size
        self._events.append(
            BlockStored(
                list(block_hashes[first : last + 1]),
                block_hashes[first - 1] if first > 0 else None,
                list(token_ids[first * bs : (last + 1) * bs]),
                bs,
                lora_id,
                self._medium,
            )
        )

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
        """Number of prompt tokens the cache can serve (full blocks, then maybe part of one
        more, see the module doc); no side effects.

        Never covers the last token (it must be computed to get logits); 0 when prefix
        caching is off.
        """
        hits = self._match(token_ids, block_hashes)
        partial = self._match_partial(token_ids, block_hashes, len(hits))
        return len(hits) * self.block_size + (partial[1] if partial else 0)

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

    def _match_partial(
        self, token_ids: Sequence[int], block_hashes: Sequence[bytes], num_hits: int
    ) -> tuple[int, int] | None:
        """(donor block, tokens) serving the most of block num_hits, or None; the last token
        is never served."""
        if num_hits == 0:
            return None
        bs = self.block_size
        start = num_hits * bs
        limit = min(bs, len(token_ids) - 1 - start)
        if limit <= 0:
            return None
        donors = self._donors.get((block_hashes[num_hits - 1], token_ids[start]))
        if not donors:
            return None
        want = token_ids[start : start + limit]
        best: tuple[int, int] | None = None
        for i, block in enumerate(reversed(donors)):
            if i == MAX_PARTIAL_CANDIDATES:
                break
            have = self._tokens[block] or self._partial[block] or ()
            n = 0
            for a, b in zip(have, want, strict=False):
                if a != b:
                    break
                n += 1
            if best is None or n > best[1]:
                best = (block, n)
                if n == limit:
                    break
        return best if best is not None and best[1] > 0 else None

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
        # A partial hit fills the first new block; none without one.
        partial = self._match_partial(token_ids, block_hashes, len(hits)) if need else None
        # Evictable hit blocks leave the free queue, so they can't also serve as new blocks.
        revived = sum(1 for b in hits if self._ref[b] == 0)
        if need > len(self._free) - revived:
            return None

        cached = len(hits) * self.block_size
        if table is None:
            table = self._tables[req_id] = []
            self._num_considered[req_id] = 0
            if partial is not None:
                cached += partial[1]
            if self.enable_prefix_caching:
                self.stats.queries += len(token_ids)
                self.stats.hits += cached
        for b in hits:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1
            table.append(b)
        for _ in range(need):
            b = self._pop_free()
            self._ref[b] = 1
            table.append(b)
        if partial is not None:
            # Copied before this step's model runs: even if the donor was just popped (for this
            # request or another), nothing has written it yet.
            self._copies.append((partial[0], table[len(hits)]))
        return cached

    def take_copies(self) -> list[tuple[int, int]]:
        """The (source, destination) block copies partial hits asked for since the last call,
        in order; the caller copies every layer's K and V before the step's model runs."""
        copies, self._copies = self._copies, []
        return copies

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
            if (events := self._events) is not None:
                if events and isinstance(events[-1], BlockRemoved):
                    events[-1].block_hashes.append(old)  # one event for a step's evictions
                else:
                    events.append(BlockRemoved([old], self._medium))
        self._drop_donor(block)
        return block

    def _add_donor(self, block: int, parent: bytes, first_token: int) -> None:
        key = (parent, first_token)
        self._donor_key[block] = key
        self._donors.setdefault(key, {})[block] = None

    def _drop_donor(self, block: int) -> None:
        key = self._donor_key[block]
        if key is None:
            return
        self._donor_key[block] = None
        self._partial[block] = None
        donors = self._donors[key]
        del donors[block]
        if not donors:
            del self._donors[key]

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
        lora_id: int | None = None,
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
        run = -1  # with events on: the first block of the run of blocks cached just now
        for i in range(start, end):
            block = table[i]
            h = block_hashes[i]
            if self._hash[block] is not None or h in self._index:
                if run >= 0:  # already cached (prefix hit, fork) or a duplicate of another
                    self._stored(run, i - 1, token_ids, block_hashes, lora_id)
                    run = -1
                continue
            self._hash[block] = h
            self._tokens[block] = tuple(token_ids[i * bs : (i + 1) * bs])
            self._index[h] = block
            if i > 0:
                self._add_donor(block, block_hashes[i - 1], token_ids[i * bs])
            if run < 0 and self._events is not None:
                run = i
        if run >= 0:
            self._stored(run, end - 1, token_ids, block_hashes, lora_id)
        self._num_considered[req_id] = max(start, end)

    def free(
        self,
        req_id: str,
        token_ids: Sequence[int] = (),
        block_hashes: Sequence[bytes] = (),
        num_computed_tokens: int = 0,
    ) -> None:
        """Drop req's table (unknown req_id: no-op) and release its blocks.

        A block reaching ref 0 without cached content goes to the FRONT of the free queue
        (reuse it first); with content it stays cached and goes to the BACK (LRU). Blocks are
        released last-first so a request's tail blocks, the least likely to be shared, are
        evicted before its head blocks. Given req's tokens, hashes and computed count, the
        computed start of its last, partial block stays cached for partial reuse.
        """
        table = self._tables.pop(req_id, None)
        if table is None:
            return
        del self._num_considered[req_id]
        self._keep_partial_tail(table, token_ids, block_hashes, num_computed_tokens)
        for b in reversed(table):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None
                if self._hash[b] is None and self._donor_key[b] is None:
                    self._free.move_to_end(b, last=False)

    def _keep_partial_tail(
        self,
        table: list[int],
        token_ids: Sequence[int],
        block_hashes: Sequence[bytes],
        num_computed: int,
    ) -> None:
        bs = self.block_size
        i, n = divmod(min(num_computed, len(token_ids)), bs)
        if not self.enable_prefix_caching or n == 0 or i == 0 or i >= len(table):
            return
        block = table[i]
        if self._ref[block] != 1 or self._hash[block] is not None or i > len(block_hashes):
            return  # shared (a fork) or already cached: not this request's to keep
        self._partial[block] = tuple(token_ids[i * bs : i * bs + n])
        self._add_donor(block, block_hashes[i - 1], token_ids[i * bs])

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
        for b in [b for donors in self._donors.values() for b in donors]:
            self._drop_donor(b)
        if self._events is not None:
            self._events.append(AllBlocksCleared())
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
        for key, donors in self._donors.items():
            _check(bool(donors), f"empty donor set for {key!r}")
            for b in donors:
                _check(self._donor_key[b] == key, f"block {b}: donor key mismatch")
                tokens = self._tokens[b] if self._hash[b] is not None else self._partial[b]
                _check(tokens is not None and tokens[0] == key[1], f"block {b}: donor tokens")
        for b in range(self.num_blocks):
            own = self._donor_key[b]
            if own is not None:
                _check(b in self._donors.get(own, {}), f"block {b}: not in its donors")
            p = self._partial[b]
            if p is not None:
                _check(self._hash[b] is None, f"block {b}: partial and full at once")
                _check(0 < len(p) < self.block_size, f"block {b}: partial of {len(p)} tokens")
                _check(self._ref[b] == 0, f"block {b}: a kept partial block is held")


def _check(cond: bool, msg: str) -> None:
    # Not `assert`: the checks must run under `python -O` too.
    if not cond:
        raise AssertionError(msg)
