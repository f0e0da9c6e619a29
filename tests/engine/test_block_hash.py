"""Chained block hashes: chaining, salt placement, incremental extension."""

from __future__ import annotations

import pytest

from surge.engine.core.block_hash import extend_block_hashes, hash_block


def test_hash_is_deterministic_bytes() -> None:
    h = hash_block(None, [1, 2, 3, 4])
    assert isinstance(h, bytes) and len(h) == 16
    assert h == hash_block(None, (1, 2, 3, 4))  # list or tuple: same content, same hash


def test_chaining_same_tokens_different_parent() -> None:
    a = hash_block(None, [1, 2, 3, 4])
    b = hash_block(None, [5, 6, 7, 8])
    # Same block tokens [9, 9, 9, 9] after two different prefixes -> different hashes.
    assert hash_block(a, [9, 9, 9, 9]) != hash_block(b, [9, 9, 9, 9])
    # No parent differs from any real parent.
    assert hash_block(None, [9, 9, 9, 9]) != hash_block(a, [9, 9, 9, 9])


def test_tokens_and_extra_matter() -> None:
    assert hash_block(None, [1, 2, 3, 4]) != hash_block(None, [1, 2, 3, 5])
    assert hash_block(None, [1, 2, 3, 4]) != hash_block(None, [1, 2, 3, 4], b"salt")
    # Large token ids (beyond int32) are hashed exactly.
    assert hash_block(None, [2**40]) != hash_block(None, [0])
    # Fields are length-prefixed: moving bytes between tokens and extra changes the hash.
    assert hash_block(None, [1, 2]) != hash_block(None, [1], (2).to_bytes(8, "little"))


def test_extend_hashes_full_blocks_and_chain() -> None:
    tokens = list(range(10))  # block_size 4: blocks [0..3], [4..7]; tail [8, 9] is partial
    hashes: list[bytes] = []
    extend_block_hashes(hashes, tokens, 4)
    h0 = hash_block(None, [0, 1, 2, 3])
    assert hashes == [h0, hash_block(h0, [4, 5, 6, 7])]


def test_extend_hashes_is_incremental() -> None:
    tokens = list(range(5))
    hashes: list[bytes] = []
    extend_block_hashes(hashes, tokens, 4)  # one full block, tail [4] ignored
    assert len(hashes) == 1
    first = hashes[0]
    extend_block_hashes(hashes, tokens, 4)  # nothing new: no-op
    assert hashes == [first]
    tokens += [5, 6]  # 7 tokens: still one full block
    extend_block_hashes(hashes, tokens, 4)
    assert len(hashes) == 1
    tokens += [7, 8, 9, 10, 11]  # 12 tokens: blocks 1 and 2 become full
    extend_block_hashes(hashes, tokens, 4)
    full: list[bytes] = []
    extend_block_hashes(full, tokens, 4)  # computed in one go: identical
    assert hashes == full and hashes[0] is first and len(hashes) == 3


def test_extra_only_in_first_block() -> None:
    tokens = list(range(8))
    plain: list[bytes] = []
    salted: list[bytes] = []
    extend_block_hashes(plain, tokens, 4)
    extend_block_hashes(salted, tokens, 4, extra=b"tenant-a")
    assert salted[0] == hash_block(None, tokens[:4], b"tenant-a")
    # Block 1 gets no extra of its own: it differs only through its (salted) parent.
    assert salted[1] == hash_block(salted[0], tokens[4:])
    assert salted[0] != plain[0] and salted[1] != plain[1]
    # Extending a salted list later never re-applies the salt.
    tokens += [8, 9, 10, 11]
    extend_block_hashes(salted, tokens, 4, extra=b"tenant-a")
    assert salted[2] == hash_block(salted[1], [8, 9, 10, 11])


def test_extend_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError):
        extend_block_hashes([], [1, 2], 0)
