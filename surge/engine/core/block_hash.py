"""Chained content hashes of full KV-cache blocks, the keys of the prefix cache.

The functions live in surge/kv_events/hashing.py: the KV events carry these hashes, and a
router that cannot import the engine (the gateway) must compute the very same ones.
"""

from __future__ import annotations

from surge.kv_events.hashing import block_hashes, extend_block_hashes, hash_block

__all__ = ["block_hashes", "extend_block_hashes", "hash_block"]
