"""Prompt rendering, chained chunk hashes and the bounded LRU behind prefix-aware routing."""

from __future__ import annotations

from surge.gateway.config import PrefixConfig
from surge.gateway.prefix_affinity import (
    PrefixAffinity,
    chunk_hashes,
    render_for_routing,
    route_key,
)

SYSTEM = "You are a careful assistant. " * 30  # ~870 characters: 3 full chunks of 256


def test_chained_hashes_share_exactly_the_common_prefix() -> None:
    a = chunk_hashes(SYSTEM + "question one " * 40, 256, 100)
    b = chunk_hashes(SYSTEM + "question two " * 40, 256, 100)
    assert len(a) == len(b) == (len(SYSTEM) + 13 * 40) // 256
    shared = len(SYSTEM) // 256
    assert a[:shared] == b[:shared]
    assert a[shared] != b[shared]
    # A chain: a chunk equal to an earlier one still hashes differently at another position.
    same_text = chunk_hashes("x" * 1024, 256, 100)
    assert len(set(same_text)) == 4


def test_short_tail_has_no_hash_and_max_chunks_bounds_work() -> None:
    assert chunk_hashes("x" * 255, 256, 100) == ()
    assert len(chunk_hashes("x" * 10_000, 256, 5)) == 5


def test_salt_separates_models_and_tenants() -> None:
    text = SYSTEM
    assert chunk_hashes(text, 256, 10, "m1") != chunk_hashes(text, 256, 10, "m2")
    cfg = PrefixConfig()
    body = {"model": "m", "prompt": text}
    k1 = route_key({**body, "cache_salt": "tenant-a"}, None, cfg)
    k2 = route_key({**body, "cache_salt": "tenant-b"}, None, cfg)
    assert k1.prefix_hashes and not set(k1.prefix_hashes) & set(k2.prefix_hashes)


def test_render_covers_every_message_not_only_the_system_prompt() -> None:
    one = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a"}]}
    two = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "b"}]}
    assert render_for_routing(one) != render_for_routing(two)
    assert render_for_routing(one).startswith(render_for_routing({"messages": one["messages"][:1]}))
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert "hi" in render_for_routing(parts)
    assert render_for_routing({"prompt": ["first", "second"]}) == "first"
    assert render_for_routing({"prompt": [1, 2, 3]}) == "1 2 3"
    assert render_for_routing({"no": "prompt"}) == ""
    # The Responses API: the same conversation renders alike as input text or as items.
    text = render_for_routing({"instructions": SYSTEM, "input": "a"})
    assert text == render_for_routing({"instructions": SYSTEM,
                                       "input": [{"role": "user", "content": "a"}]})  # fmt: skip
    assert text == render_for_routing(one)


def test_route_key_session_from_header_else_user() -> None:
    assert route_key({"user": "u1"}, None, None).session == "u1"
    assert route_key({"user": "u1"}, "s9", None).session == "s9"
    assert route_key(None, "s9", None).session == "s9"
    assert route_key({"prompt": SYSTEM}, None, None).prefix_hashes == ()  # not hashed: no policy
    assert len(route_key({"prompt": SYSTEM}, None, PrefixConfig()).prefix_hashes) == 3


def test_lru_bound_holds_and_evicts_the_oldest() -> None:
    lru = PrefixAffinity(max_entries=100)
    for i in range(50):
        lru.record(tuple(range(i * 10, i * 10 + 10)), f"u{i}")
        assert len(lru) <= 100
    assert len(lru) == 100
    assert lru.match((0,), {"u0"}) == (None, 0)  # evicted
    assert lru.match((495,), {"u49"}) == ("u49", 1)


def test_lru_touch_keeps_a_hot_prefix() -> None:
    lru = PrefixAffinity(max_entries=6)
    lru.record((1, 2), "hot")
    for i in range(10):
        lru.record((100 + i, 200 + i), "cold")
        lru.record((1, 2), "hot")  # used again: moves to the young end
    assert lru.match((1, 2), {"hot"}) == ("hot", 2)
