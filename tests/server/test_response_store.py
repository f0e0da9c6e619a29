"""The Responses API's store: bounded, least recently used out first, an entry only for the key
that made it."""

from __future__ import annotations

from surge.server.response_store import ResponseStore, StoredResponse


def _entry(rid: str, owner: str = "") -> StoredResponse:
    return StoredResponse({"id": rid, "output": []}, [], [], owner)


def test_least_recently_used_goes_first() -> None:
    store = ResponseStore(2)
    store.put(_entry("a"))
    store.put(_entry("b"))
    assert store.get("a", "") is not None  # a is used: b is now the oldest
    store.put(_entry("c"))
    assert len(store) == 2
    assert store.get("b", "") is None
    assert store.get("a", "") is not None and store.get("c", "") is not None


def test_an_entry_is_only_its_owners() -> None:
    store = ResponseStore(4)
    store.put(_entry("a", owner="key-1"))
    assert store.get("a", "key-2") is None and store.get("a", "") is None
    assert not store.delete("a", "key-2")
    assert store.get("a", "key-1") is not None
    assert store.delete("a", "key-1") and store.get("a", "key-1") is None


def test_size_zero_stores_nothing() -> None:
    store = ResponseStore(0)
    store.put(_entry("a"))
    assert not store.enabled and len(store) == 0
