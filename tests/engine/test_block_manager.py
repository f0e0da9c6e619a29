"""BlockManager: allocation, prefix hits, eviction order, fork, invariants.

Small pool (block_size 4, 10 blocks) so every expected block id and free-queue order is exact.
"""

from __future__ import annotations

import random

import pytest

from surge.engine.core.block_hash import extend_block_hashes
from surge.engine.core.block_manager import BlockManager

BS = 4


def hashes(tokens: list[int], extra: bytes = b"") -> list[bytes]:
    out: list[bytes] = []
    extend_block_hashes(out, tokens, BS, extra)
    return out


def add(bm: BlockManager, req: str, tokens: list[int]) -> int | None:
    """Allocate a new request's whole prompt, as the scheduler does."""
    return bm.allocate_slots(req, len(tokens), tokens, hashes(tokens))


def compute(bm: BlockManager, req: str, tokens: list[int]) -> None:
    """The model ran over all of `tokens`: register the full blocks."""
    bm.cache_full_blocks(req, tokens, hashes(tokens), len(tokens))


def snapshot(bm: BlockManager, reqs: list[str]) -> tuple[object, ...]:
    tables = {r: bm.block_table(r) for r in reqs if bm.has(r)}
    counters = (bm.stats.queries, bm.stats.hits)
    return tables, bm.free_block_ids(), bm.num_free_blocks, bm.usage(), counters


A = list(range(100, 109))  # 9 tokens: 2 full blocks + 1 tail token
B = list(range(200, 209))


def test_fresh_allocation_and_decode_growth() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    assert bm.num_free_blocks == 10 and bm.usage() == 0.0
    # 10 tokens -> 3 blocks, taken from the front of the queue in order.
    assert bm.allocate_slots("a", 10) == 0
    assert bm.block_table("a") == [0, 1, 2]
    assert bm.num_free_blocks == 7 and bm.usage() == pytest.approx(0.3)
    # Decode: tokens 11 and 12 still fit in block 2; token 13 crosses into a new block.
    assert bm.allocate_slots("a", 11) == 0
    assert bm.allocate_slots("a", 12) == 0
    assert bm.block_table("a") == [0, 1, 2]
    assert bm.allocate_slots("a", 13) == 0
    assert bm.block_table("a") == [0, 1, 2, 3]
    # Asking for less than the current coverage is a no-op.
    assert bm.allocate_slots("a", 5) == 0
    assert bm.block_table("a") == [0, 1, 2, 3]
    # Fill the pool exactly: 6 blocks left.
    assert bm.allocate_slots("b", 24) == 0
    assert bm.block_table("b") == [4, 5, 6, 7, 8, 9]
    assert bm.num_free_blocks == 0 and bm.usage() == 1.0
    bm.check_invariants()
    # Out of blocks: None, and nothing changes (no table for c, a not grown).
    before = snapshot(bm, ["a", "b", "c"])
    assert bm.allocate_slots("c", 1) is None
    assert not bm.has("c")
    assert bm.allocate_slots("a", 17) is None
    assert snapshot(bm, ["a", "b", "c"]) == before
    bm.check_invariants()


def test_prefix_hit_while_first_request_runs() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = list(range(10))
    assert add(bm, "a", a) == 0  # blocks [0, 1, 2]
    compute(bm, "a", a)  # blocks 0 and 1 are full -> cached; block 2 (2 tokens) is not
    # b shares a's first 8 tokens, then diverges.
    b = [*a[:8], 100, 101, 102]
    assert bm.lookup_prefix(b, hashes(b)) == 8
    assert bm.num_free_blocks == 7  # lookup has no side effects
    assert add(bm, "b", b) == 8
    assert bm.block_table("b") == [0, 1, 3]  # shared 0 and 1, fresh 3 for the tail
    assert bm.num_free_blocks == 6
    assert (bm.stats.queries, bm.stats.hits) == (10 + 11, 8)
    bm.check_invariants()
    # Freeing a: blocks 0 and 1 are still referenced by b (ref was 2), only block 2 frees.
    bm.free("a")
    assert bm.num_free_blocks == 7 and 0 not in bm.free_block_ids()
    # A prompt of exactly 8 tokens: both blocks cached, but the last token must be computed,
    # so the first block is shared and block 1's first 3 tokens are copied into a new block.
    c = a[:8]
    assert bm.take_copies() == []
    assert bm.lookup_prefix(c, hashes(c)) == 7
    assert add(bm, "c", c) == 7
    assert bm.block_table("c") == [0, 2]
    assert bm.take_copies() == [(1, 2)] and bm.take_copies() == []
    # Later calls never report cached tokens again.
    assert bm.allocate_slots("c", 9, c, hashes(c)) == 0
    bm.check_invariants()


def test_hit_after_finish_takes_blocks_out_of_free_queue() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    add(bm, "a", A)  # [0, 1, 2]
    compute(bm, "a", A)
    bm.free("a")
    # Uncached block 2 to the front; cached 1 then 0 to the back (tail first).
    assert bm.free_block_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    assert bm.usage() == 0.0
    b = [*A[:8], 999]
    assert add(bm, "b", b) == 8
    assert bm.block_table("b") == [0, 1, 2]  # revived 0, 1; block 2 popped from the front
    assert bm.free_block_ids() == [3, 4, 5, 6, 7, 8, 9]
    bm.check_invariants()


def test_revived_hit_blocks_count_against_capacity() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    add(bm, "a", A)  # [0, 1, 2]
    compute(bm, "a", A)
    bm.free("a")
    assert bm.free_block_ids() == [2, 3, 1, 0]
    # 17 tokens = 5 blocks: 2 hits + 3 new. 4 blocks are free, but 2 of them ARE the hits.
    b = [*A[:8], *range(300, 309)]
    before = snapshot(bm, ["b"])
    assert add(bm, "b", b) is None
    assert snapshot(bm, ["b"]) == before and not bm.has("b")
    # 16 tokens = 2 hits + 2 new: fits exactly.
    assert add(bm, "b", b[:16]) == 8
    assert bm.block_table("b") == [0, 1, 2, 3]
    assert bm.num_free_blocks == 0
    bm.check_invariants()


def test_forged_hash_with_different_tokens_never_hits() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    add(bm, "a", A)
    compute(bm, "a", A)
    forged = hashes(A)  # a's real hashes, presented with other tokens
    other = [5, 5, 5, 5, 6, 6, 6, 6, 7]
    assert bm.lookup_prefix(other, forged) == 0
    # Right first block, wrong second block: the hit stops at the first mismatch.
    half = [*A[:4], 6, 6, 6, 6, 7]
    assert bm.lookup_prefix(half, forged) == 4
    assert bm.allocate_slots("x", len(other), other, forged) == 0
    assert bm.block_table("x") == [3, 4, 5]  # fresh blocks, not a's 0 and 1
    # A forged list repeating one hash cannot map two positions to the same block.
    rep = [1, 1, 1, 1, 1, 1, 1, 1, 1]
    bm.allocate_slots("r", 9, rep, hashes(rep))
    compute(bm, "r", rep)
    # (The second block is still served, by its content: a copy of r's block 1, which does
    # hold 1, 1, 1, 1 after 1, 1, 1, 1; never by mapping block 0 to both positions.)
    bm.free("x")
    assert bm.lookup_prefix(rep, [hashes(rep)[0]] * 2) == 8
    assert bm.allocate_slots("s", 9, rep, [hashes(rep)[0]] * 2) == 8
    table = bm.block_table("s")
    assert len(set(table)) == 3 and bm.take_copies() == [(bm.block_table("r")[1], table[1])]
    bm.check_invariants()


def test_eviction_order_lru_tail_first_uncached_first() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    add(bm, "a", A)  # [0, 1, 2]
    compute(bm, "a", A)  # 0, 1 cached
    add(bm, "b", B)  # [3, 4, 5]
    compute(bm, "b", B)  # 3, 4 cached
    bm.free("a")
    assert bm.free_block_ids() == [2, 6, 7, 8, 9, 1, 0]
    bm.free("b")
    # Uncached first (5 just freed, then 2, then never-used), then cached, oldest free first,
    # each request's tail block before its head block.
    assert bm.free_block_ids() == [5, 2, 6, 7, 8, 9, 1, 0, 4, 3]
    # c hits a's prefix: 0 and 1 leave the queue; its tail takes block 5.
    c = [*A[:8], 999]
    assert add(bm, "c", c) == 8
    assert bm.block_table("c") == [0, 1, 5]
    bm.free("c")
    # a's blocks were just used: they are now the most recent, behind b's.
    assert bm.free_block_ids() == [5, 2, 6, 7, 8, 9, 4, 3, 1, 0]
    # A 28-token request takes 7 blocks: all 6 uncached, then evicts b's tail block 4.
    assert bm.allocate_slots("d", 28) == 0
    assert bm.block_table("d") == [5, 2, 6, 7, 8, 9, 4]
    assert bm.lookup_prefix(B, hashes(B)) == 4  # block 4's hash is gone; block 3 still hits
    assert bm.allocate_slots("e", 4) == 0
    assert bm.block_table("e") == [3]  # next victim: b's head block
    assert bm.lookup_prefix(B, hashes(B)) == 0
    assert bm.lookup_prefix(A, hashes(A)) == 8  # a's blocks survived (most recently used)
    bm.check_invariants()


def test_duplicate_concurrent_prefix_keeps_one_entry() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    # Both scheduled before either computed: no hit for b, separate blocks.
    assert add(bm, "a", A) == 0
    assert add(bm, "b", A) == 0
    assert bm.block_table("a") == [0, 1, 2] and bm.block_table("b") == [3, 4, 5]
    compute(bm, "a", A)  # registers 0, 1
    compute(bm, "b", A)  # same hashes already map to 0, 1: 3, 4 stay unregistered
    bm.check_invariants()
    bm.free("b")
    # All of b's blocks are uncached, so they all go to the front.
    assert bm.free_block_ids() == [3, 4, 5, 6, 7, 8, 9]
    bm.free("a")
    assert bm.free_block_ids() == [2, 3, 4, 5, 6, 7, 8, 9, 1, 0]
    assert bm.lookup_prefix(A, hashes(A)) == 8
    bm.check_invariants()


def test_cache_full_blocks_during_decode() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    toks = list(range(6))
    add(bm, "a", toks)  # [0, 1]
    compute(bm, "a", toks)  # block 0 cached; block 1 holds 2 tokens
    toks += [6, 7]  # two decode steps fill block 1
    bm.allocate_slots("a", 8)
    bm.cache_full_blocks("a", toks, hashes(toks), 7)  # token 7's KV not computed yet
    probe = [*toks, 42]
    assert bm.lookup_prefix(probe, hashes(probe)) == 4
    bm.cache_full_blocks("a", toks, hashes(toks), 8)
    assert bm.lookup_prefix(probe, hashes(probe)) == 8
    bm.check_invariants()


def test_fork_shares_blocks() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=False)
    p = list(range(10))
    add(bm, "a", p)  # [0, 1, 2]
    bm.fork("a", "b", 2)  # the 2 full prompt blocks are shared
    assert bm.block_table("b") == [0, 1]
    assert bm.allocate_slots("b", 10) == 0
    assert bm.block_table("b") == [0, 1, 3]  # own copy of the partial block
    assert bm.usage() == pytest.approx(0.4)
    bm.check_invariants()
    with pytest.raises(ValueError):
        bm.fork("a", "b", 1)  # b already has a table
    with pytest.raises(ValueError):
        bm.fork("a", "c", 4)  # a has only 3 blocks
    bm.free("a")
    assert bm.free_block_ids() == [2, 4, 5, 6, 7, 8, 9]  # 0, 1 still held by b
    bm.free("b")
    assert bm.free_block_ids() == [0, 1, 3, 2, 4, 5, 6, 7, 8, 9]
    assert bm.usage() == 0.0
    bm.check_invariants()


def test_prefix_caching_off() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=False)
    add(bm, "a", A)
    compute(bm, "a", A)  # no-op
    assert bm.lookup_prefix(A, hashes(A)) == 0
    bm.free("a")
    assert bm.free_block_ids() == list(range(10))  # nothing cached: all back to the front
    assert add(bm, "b", A) == 0
    assert bm.block_table("b") == [0, 1, 2]
    assert (bm.stats.queries, bm.stats.hits) == (0, 0)
    bm.check_invariants()


def test_reset_prefix_cache() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    add(bm, "a", A)
    compute(bm, "a", A)
    assert bm.reset_prefix_cache() is False  # a still references cached blocks
    assert bm.lookup_prefix(A, hashes(A)) == 8
    bm.free("a")
    order = bm.free_block_ids()
    assert bm.reset_prefix_cache() is True
    assert bm.lookup_prefix(A, hashes(A)) == 0
    assert bm.free_block_ids() == order
    bm.check_invariants()


def test_free_everything() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    add(bm, "a", A)
    compute(bm, "a", A)
    add(bm, "b", [*A[:8], 7, 7, 7])  # shares a's blocks
    bm.allocate_slots("c", 3)
    bm.fork("b", "d", 2)
    bm.free("nope")  # unknown: no-op
    for r in ["c", "a", "d", "b"]:
        bm.free(r)
        assert not bm.has(r)
        bm.check_invariants()
    assert bm.usage() == 0.0 and bm.num_free_blocks == 10
    with pytest.raises(KeyError):
        bm.block_table("a")


def test_random_operations_keep_invariants() -> None:
    """1,000 random add/fork/grow/abort/finish ops on a tight pool with shared prefixes.

    A fake KV store records, for every written slot, the full token prefix it was computed
    from; every prefix hit must serve exactly the requested prefix, and no request may ever
    write into a block another request holds.
    """
    rng = random.Random(1234)
    bm = BlockManager(num_blocks=40, block_size=BS)
    prefixes = [[rng.randrange(50) for _ in range(n)] for n in (0, 4, 8, 11)]
    kv: dict[int, dict[int, tuple[int, ...]]] = {}  # block -> slot -> prefix it was computed on
    running: dict[str, tuple[list[int], list[bytes], bytes]] = {}  # tokens, hashes, salt

    def write(req: str, tokens: list[int], start: int) -> None:
        table = bm.block_table(req)
        for pos in range(start, len(tokens)):
            block = table[pos // BS]
            holders = [r for r in running if block in bm.block_table(r)]
            assert holders == [req], f"{req} writes block {block} held by {holders}"
            kv.setdefault(block, {})[pos % BS] = tuple(tokens[: pos + 1])
        bm.cache_full_blocks(req, tokens, running[req][1], len(tokens))

    next_id = 0
    num_copies = 0
    for _ in range(1000):
        op = rng.choices(["add", "fork", "grow", "abort", "finish"], [4, 1, 6, 1, 1])[0]
        req = rng.choice(sorted(running)) if running else None
        if op == "add" or req is None:
            req, next_id = f"r{next_id}", next_id + 1
            tokens = [*rng.choice(prefixes), *(rng.randrange(50) for _ in range(rng.randint(1, 9)))]
            salt = rng.choice([b"", b"", b"tenant"])
            hs: list[bytes] = []
            extend_block_hashes(hs, tokens, BS, salt)
            expected = bm.lookup_prefix(tokens, hs)
            cached = bm.allocate_slots(req, len(tokens), tokens, hs)
            if cached is None:
                assert not bm.has(req)
                continue
            assert cached == expected
            for src, dst in bm.take_copies():  # a partial hit: its block copied, as the runner does
                kv[dst] = dict(kv[src])
                num_copies += 1
            table = bm.block_table(req)
            for pos in range(cached):  # the served prefix is exactly ours
                assert kv[table[pos // BS]][pos % BS] == tuple(tokens[: pos + 1])
            running[req] = (tokens, hs, salt)
            write(req, tokens, cached)
        elif op == "fork":
            tokens, hs, salt = running[req]
            child, next_id = f"r{next_id}", next_id + 1
            shared = len(tokens) // BS  # only full blocks are shared
            bm.fork(req, child, shared)
            if bm.allocate_slots(child, len(tokens)) is None:
                bm.free(child)
                continue
            running[child] = (list(tokens), list(hs), salt)
            write(child, running[child][0], shared * BS)
        elif op == "grow":
            tokens, hs, salt = running[req]
            tokens.append(rng.randrange(50))
            extend_block_hashes(hs, tokens, BS, salt)
            if len(tokens) > 40 or bm.allocate_slots(req, len(tokens)) is None:
                # Finished, or preempted for lack of blocks: its last block's computed start
                # stays reusable.
                bm.free(req, tokens[:-1], hs, len(tokens) - 1)
                del running[req]
            else:
                write(req, tokens, len(tokens) - 1)
        else:  # abort or finish: same bookkeeping
            tokens, hs, _ = running[req]
            bm.free(req, tokens, hs, len(tokens))
            del running[req]
        bm.check_invariants()
        assert bm.num_free_blocks + len({b for r in running for b in bm.block_table(r)}) == 40

    assert bm.stats.hits > 0 and num_copies > 0
    for req in list(running):
        bm.free(req)
    bm.check_invariants()
    assert bm.usage() == 0.0 and bm.num_free_blocks == 40
    assert bm.reset_prefix_cache() is True
    bm.check_invariants()


# ---- partial-block reuse ----------------------------------------------------------------------
def finish(bm: BlockManager, req: str, tokens: list[int], salt: bytes = b"") -> None:
    """The request ends with every token computed: its last block's start stays reusable."""
    bm.free(req, tokens, hashes(tokens, salt), len(tokens))


def test_a_finished_requests_partial_tail_is_copied_for_a_follow_up() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = list(range(10))  # blocks [0, 1, 2]; block 2 holds 2 computed tokens
    add(bm, "a", a)
    compute(bm, "a", a)
    finish(bm, "a", a)
    # The kept tail is cached content: at the back of the queue, before a's head (tail first).
    assert bm.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1, 0]
    bm.check_invariants()
    follow_up = [*a, 50, 51]
    assert bm.lookup_prefix(follow_up, hashes(follow_up)) == 10  # 8 shared + 2 copied
    assert add(bm, "b", follow_up) == 10
    assert bm.block_table("b") == [0, 1, 3]
    assert bm.take_copies() == [(2, 3)]
    assert (bm.stats.queries, bm.stats.hits) == (10 + 12, 10)
    bm.check_invariants()
    # The same prompt again: everything but its last token. A prompt that diverges inside the
    # block: only the common tokens.
    assert bm.lookup_prefix(a, hashes(a)) == 9
    diverged = [*a[:9], 77, 78]
    assert bm.lookup_prefix(diverged, hashes(diverged)) == 9
    other = [*a[:8], 77, 78]
    assert bm.lookup_prefix(other, hashes(other)) == 8


def test_the_longest_partial_match_is_served() -> None:
    bm = BlockManager(num_blocks=12, block_size=BS)
    for name, tail in (("a", [8, 60]), ("b", [8, 9, 10]), ("c", [8, 9, 70])):
        tokens = [*range(8), *tail]
        add(bm, name, tokens)
        compute(bm, name, tokens)
        finish(bm, name, tokens)
    # b and c started from the tails before them (a's block 2, then b's block 3): copies.
    assert bm.take_copies() == [(2, 3), (3, 4)]
    want = [*range(8), 8, 9, 10, 11, 12]
    assert bm.lookup_prefix(want, hashes(want)) == 11
    assert add(bm, "d", want) == 11
    assert bm.take_copies() == [(3, 5)]  # b's tail, 8 9 10, the longest of the three
    bm.check_invariants()


def test_partial_reuse_respects_the_cache_salt_and_eviction() -> None:
    bm = BlockManager(num_blocks=5, block_size=BS)
    a = list(range(10))
    bm.allocate_slots("a", 10, a, hashes(a, b"tenant"))
    bm.cache_full_blocks("a", a, hashes(a, b"tenant"), 10)
    finish(bm, "a", a, b"tenant")
    follow_up = [*a, 50]
    assert bm.lookup_prefix(follow_up, hashes(follow_up)) == 0  # another tenant's prefix
    assert bm.lookup_prefix(follow_up, hashes(follow_up, b"tenant")) == 10
    # Two uncached blocks are reused first; the third pop evicts the kept tail (block 2).
    assert bm.allocate_slots("x", 12) == 0
    assert bm.block_table("x") == [3, 4, 2]
    assert bm.lookup_prefix(follow_up, hashes(follow_up, b"tenant")) == 8
    bm.check_invariants()
    bm.free("x")
    assert bm.reset_prefix_cache() is True
    assert bm.lookup_prefix(follow_up, hashes(follow_up, b"tenant")) == 0
    bm.check_invariants()


def test_no_partial_without_the_tokens_or_for_the_first_block() -> None:
    bm = BlockManager(num_blocks=10, block_size=BS)
    a = list(range(10))
    add(bm, "a", a)
    compute(bm, "a", a)
    bm.free("a")  # no tokens given (an old caller): the tail is plain free space
    assert bm.free_block_ids()[0] == 2
    follow_up = [*a, 50]
    assert bm.lookup_prefix(follow_up, hashes(follow_up)) == 8
    short = [1, 2, 3]  # within the first block: no parent to key a donor by (nor a salt)
    add(bm, "s", short)
    compute(bm, "s", short)
    finish(bm, "s", short)
    assert bm.lookup_prefix([1, 2, 3, 4], hashes([1, 2, 3, 4])) == 0
    bm.check_invariants()
