"""vLLM's KV-events wire format (vllm/distributed/kv_events.py), so that an llm-d or Dynamo
indexer can read a Surge engine's events and Surge's router can read theirs.

Each ZMQ PUB message has three frames: the topic, the batch's sequence number (8 bytes, big
endian, counting from 0 per publisher) and the msgpack payload. The payload is vLLM's
KVEventBatch encoded as msgspec encodes `array_like` structs: arrays of the fields in order,
each event tagged by its class name first:

    [ts, [event, ...], data_parallel_rank]
    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]

Block hashes are Surge's 16-byte digests (msgpack bin; vLLM's ExternalBlockHash is bytes or
int). The replay socket (ROUTER) answers an 8-byte start sequence with [seq, payload] frames
for every buffered batch from there, then [-1, b""].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks entered the prefix cache: a run of chained blocks, the first one's parent."""

    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the prefix cache (evicted for reuse)."""

    block_hashes: list[bytes]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped (a reset, or a fresh start)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    ts: float
    events: list[KVEvent] = field(default_factory=list)
    data_parallel_rank: int | None = None


def _event_array(e: KVEvent) -> list[Any]:
    if isinstance(e, BlockStored):
        return ["BlockStored", e.block_hashes, e.parent_block_hash, e.token_ids, e.block_size,
                e.lora_id, e.medium]  # fmt: skip
    if isinstance(e, BlockRemoved):
        return ["BlockRemoved", e.block_hashes, e.medium]
    return ["AllBlocksCleared"]


def encode_batch(batch: KVEventBatch) -> bytes:
    return msgpack.packb(
        [batch.ts, [_event_array(e) for e in batch.events], batch.data_parallel_rank],
        use_bin_type=True,
    )


def _hash(value: Any) -> bytes:
    """A block hash as bytes: Surge's digests as they are; another engine's int hashes as
    their 8 big-endian bytes (they only need to compare equal with themselves)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, int):
        return value.to_bytes(8, "big", signed=value < 0)
    raise ValueError(f"block hash must be bytes or int, got {type(value).__name__}")


def _hashes(values: Any) -> list[bytes]:
    if not isinstance(values, list):
        raise ValueError("block_hashes must be a list")
    return [_hash(v) for v in values]


def _decode_event(raw: Any) -> KVEvent | None:
    """One event; None for a kind this reader does not know (newer engines add some)."""
    if not isinstance(raw, list) or not raw or not isinstance(raw[0], str):
        raise ValueError(f"bad KV event {raw!r:.80}")
    tag, fields = raw[0], raw[1:]
    if tag == "BlockStored":
        hashes, parent, tokens, block_size = fields[:4]
        rest = [*fields[4:6], None, None][:2]  # lora_id, medium: optional (omit_defaults)
        return BlockStored(
            _hashes(hashes),
            None if parent is None else _hash(parent),
            [int(t) for t in tokens],
            int(block_size),
            rest[0],
            rest[1],
        )
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(fields[0]), fields[1] if len(fields) > 1 else None)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes) -> KVEventBatch:
    """ValueError for anything that is not a KVEventBatch."""
    try:
        raw = msgpack.unpackb(payload, raw=False)
    except (msgpack.UnpackException, ValueError) as e:
        raise ValueError(f"bad KV event batch: {e}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise ValueError("a KV event batch is [ts, events, data_parallel_rank]")
    try:
        events = [e for e in map(_decode_event, raw[1]) if e is not None]
    except (TypeError, IndexError) as e:
        raise ValueError(f"bad KV event: {e}") from None
    rank = raw[2] if len(raw) > 2 else None
    return KVEventBatch(float(raw[0]), events, rank)


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def parse_seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise ValueError(f"a sequence number is 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def message(topic: bytes, seq: int, payload: bytes) -> Sequence[bytes]:
    """The three frames of one published batch."""
    return (topic, seq_bytes(seq), payload)
