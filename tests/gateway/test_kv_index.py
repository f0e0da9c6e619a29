"""The KV index and the kv_aware policy on their own: what a replica's events say it holds,
what a lost or restarted stream does to that, and how a pick weighs a match against load;
and the block manager's side: the events it records for what it caches and evicts."""

from __future__ import annotations

from surge.engine.core.block_manager import BlockManager
from surge.gateway.config import PrefixConfig
from surge.gateway.kv_balancer import KvAware
from surge.gateway.kv_index import KvIndex
from surge.gateway.upstreams import RouteKey, UpstreamSnapshot
from surge.kv_events.hashing import block_hashes
from surge.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)

A, B = "http://a:1", "http://b:1"
TOKENS = tuple(range(100, 164))  # 4 blocks of 16


def _stored(tokens: tuple[int, ...], salt: bytes = b"") -> KVEventBatch:
    hashes = block_hashes(tokens, 16, salt)
    return KVEventBatch(1.0, [BlockStored(hashes, None, list(tokens[: 16 * len(hashes)]), 16)])


def test_the_wire_format_round_trips_as_vllms_array_form() -> None:
    batch = KVEventBatch(
        2.5,
        [
            BlockStored([b"\x01" * 16], None, [1, 2], 16, 3, "CPU"),
            BlockRemoved([b"\x01" * 16], "CPU"),
            AllBlocksCleared(),
        ],
        0,
    )
    assert decode_batch(encode_batch(batch)) == batch
    import msgpack

    raw = msgpack.unpackb(encode_batch(batch))
    assert raw[1][0][0] == "BlockStored" and raw[1][2] == ["AllBlocksCleared"] and raw[2] == 0


def test_index_follows_stores_removes_and_drops_on_a_gap_or_restart() -> None:
    index = KvIndex()
    drops: list[str] = []
    index.on_drop = lambda url, reason: drops.append(reason)
    hashes = block_hashes(TOKENS, 16)
    index.apply(A, 0, KVEventBatch(0.0, [AllBlocksCleared()]))
    index.apply(A, 1, _stored(TOKENS))
    assert index.matched(A, hashes) == 4 and index.block_size(A) == 16
    index.apply(A, 2, KVEventBatch(0.0, [BlockRemoved([hashes[2]])]))
    assert index.matched(A, hashes) == 2  # a chain: nothing past the first missing block
    index.apply(A, 4, _stored(TOKENS[:32]))  # seq 3 was lost
    assert drops == ["gap"] and index.matched(A, hashes) == 2  # only what seq 4 said
    index.apply(A, 0, KVEventBatch(0.0, [AllBlocksCleared()]))  # it restarted
    assert drops == ["gap", "restart"] and index.blocks(A) == 0


def test_kv_aware_picks_the_holder_unless_it_is_too_busy() -> None:
    index = KvIndex()
    index.set_block_size(A, 16)
    index.set_block_size(B, 16)
    index.apply(B, 0, _stored(TOKENS))
    balancer = KvAware(PrefixConfig(balance_abs=4, balance_rel=1.5), index)
    key = RouteKey(prompt_tokens=(*TOKENS, 7, 8, 9))
    idle = [UpstreamSnapshot(A), UpstreamSnapshot(B)]
    assert balancer.pick(idle, key) == B
    busy = [UpstreamSnapshot(A, in_flight=1), UpstreamSnapshot(B, in_flight=3)]
    assert balancer.pick(busy, key) == B  # busier, within the thresholds
    swamped = [UpstreamSnapshot(A, in_flight=1), UpstreamSnapshot(B, in_flight=9)]
    assert balancer.pick(swamped, key) == A
    other_tenant = RouteKey(prompt_tokens=key.prompt_tokens, cache_salt="t2")
    loaded = [UpstreamSnapshot(A), UpstreamSnapshot(B, in_flight=1)]
    assert balancer.pick(loaded, other_tenant) == A  # its salt: other hashes, least loaded
    assert balancer.pick(loaded, RouteKey()) == A


def test_block_manager_records_what_enters_and_leaves_its_cache() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.enable_events("CPU")
    tokens = list(range(1, 11))  # 2 full blocks + 2 tokens
    hashes = block_hashes(tokens, 4)
    assert bm.allocate_slots("r1", len(tokens), tokens, hashes) == 0
    bm.cache_full_blocks("r1", tokens, hashes, len(tokens), lora_id=None)
    bm.free("r1", tokens, hashes, len(tokens))
    (stored,) = bm.take_events()
    assert stored == BlockStored(hashes, None, tokens[:8], 4, None, "CPU")
    other = list(range(50, 66))  # 4 blocks: the cached ones must be evicted
    bm.allocate_slots("r2", len(other), other, block_hashes(other, 4))
    (removed,) = bm.take_events()  # one event for the step's evictions
    assert isinstance(removed, BlockRemoved) and removed.medium == "CPU"
    assert sorted(removed.block_hashes) == sorted(hashes)
    bm.free("r2")
    assert bm.reset_prefix_cache() and bm.take_events() == [AllBlocksCleared()]
    quiet = BlockManager(num_blocks=4, block_size=4)  # events off: nothing recorded
    quiet.allocate_slots("r", len(tokens), tokens, hashes)
    quiet.cache_full_blocks("r", tokens, hashes, len(tokens))
    assert quiet.take_events() == []


def test_routed_claims_count_until_events_or_their_time_say_otherwise() -> None:
    now = [0.0]
    index = KvIndex(routed_ttl_s=5.0, clock=lambda: now[0])
    for url in (A, B):
        index.set_block_size(url, 16)
    balancer = KvAware(PrefixConfig(balance_abs=4, balance_rel=1.5), index)
    key = RouteKey(prompt_tokens=(*TOKENS, 7))
    hashes = block_hashes(TOKENS, 16)
    # A new prefix goes by load; the same prefix again, before any event, follows it there
    # although the other replica is now less loaded (within the thresholds).
    assert balancer.pick([UpstreamSnapshot(A, in_flight=1), UpstreamSnapshot(B)], key) == B
    assert index.matched(B, hashes) == 4 and index.blocks(B) == 0  # claimed, not held
    assert balancer.pick([UpstreamSnapshot(A), UpstreamSnapshot(B, in_flight=2)], key) == B
    # Its events remove a block: the claim past it goes too.
    index.apply(B, 0, KVEventBatch(0.0, [BlockRemoved([hashes[1]])]))
    assert index.matched(B, hashes) == 1
    # A claim expires: with nothing stored, nothing is held.
    now[0] = 6.0
    assert index.matched(B, hashes) == 0
    # Stored blocks are facts (they outlive claims); a drop forgets the claims too.
    balancer.pick([UpstreamSnapshot(A, in_flight=1), UpstreamSnapshot(B)], key)
    index.apply(B, 1, _stored(TOKENS[:32]))
    now[0] = 20.0
    assert index.matched(B, hashes) == 2
    balancer.pick([UpstreamSnapshot(A, in_flight=1), UpstreamSnapshot(B)], key)
    assert index.matched(B, hashes) == 4
    index.drop(B, "disconnected")
    assert index.matched(B, hashes) == 0
    # Off (the default of a bare index): only events count.
    bare = KvIndex()
    bare.set_block_size(A, 16)
    KvAware(PrefixConfig(), bare).pick([UpstreamSnapshot(A)], key)
    assert bare.matched(A, hashes) == 0
