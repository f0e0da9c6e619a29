"""Dequantizing GGUF's simple block formats (Q4_0, Q4_1, Q8_0) in torch.

The same arithmetic as `gguf.quants` (float32 products of the float16 scales, then the offset),
so the values are bit for bit the same, but vectorized over the whole tensor on every core:
gguf's numpy path takes a Python loop over row groups, about a second of SmolLM2's load.
Other formats return None: the caller falls back to gguf.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

BLOCK = 32
# bytes a block: float16 scale (and Q4_1's float16 min), then the quants
_BLOCK_BYTES = {T.Q4_0: 18, T.Q4_1: 20, T.Q8_0: 34}


def dequantize_blocks(data: np.ndarray, kind: T) -> torch.Tensor | None:
    """float32 values, flat, of a tensor's raw blocks; None for formats not handled here."""
    size = _BLOCK_BYTES.get(kind)
    if size is None:
        return None
    # A copy out of the read-only memory map (torch wants writable memory), one memcpy.
    raw = torch.from_numpy(np.array(data, dtype=np.uint8, copy=True).reshape(-1, size))
    d = raw[:, 0:2].contiguous().view(torch.float16).float()  # [blocks, 1]
    if kind == T.Q8_0:
        return (raw[:, 2:].contiguous().view(torch.int8).float() * d).reshape(-1)
    qs = raw[:, 4:] if kind == T.Q4_1 else raw[:, 2:]
    # The low nibbles are a block's first 16 values, the high nibbles its last 16.
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1)
    if kind == T.Q4_0:
        return ((q.to(torch.int8) - 8).float() * d).reshape(-1)
    m = raw[:, 2:4].contiguous().view(torch.float16).float()
    return (d * q.float() + m).reshape(-1)


# Block types whose values are d * q + m with q in 0..15, float16 d and m, 32 to a block: the
# layout of surge/models/q4.py, so their blocks map into it without a float round trip.
Q4_BLOCK_TYPES = frozenset({T.Q4_0, T.Q4_1})


def q4_scales(raw: np.ndarray, kind: T) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """As `q4_fields`, in numpy, the quants left as the file's bytes [N, K/32, 16] (for
    q4.pack_block_bytes), d and m float16 [N, K/32]."""
    if kind not in Q4_BLOCK_TYPES:
        raise ValueError(f"{kind.name} blocks do not map into the q4 layout")
    size = _BLOCK_BYTES[kind]
    blocks = raw.reshape(raw.shape[0], -1, size)
    d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0]
    if kind == T.Q4_0:  # -8d: exact, so the float32 product rounds to itself
        return blocks[..., 2:], d, (d.astype(np.float32) * -8.0).astype(np.float16)
    m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0]
    return blocks[..., 4:], d, m


def q4_fields(raw: torch.Tensor, kind: T) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of Q4_0/Q4_1 blocks (uint8 [N, K/32 * block bytes]) -> (q uint8 [N, K] in 0..15,
    natural order; d, m float16 [N, K/32]), with w = d * q + m exactly as gguf.quants computes
    it in float32. Q4_0's w = d * (q - 8) gives m = -8d: exact in float16 (a power-of-two
    multiple; no float16 scale of real weights comes near the 8188 where -8d would overflow)."""
    if kind not in Q4_BLOCK_TYPES:
        raise ValueError(f"{kind.name} blocks do not map into the q4 layout")
    size = _BLOCK_BYTES[kind]
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, size)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1)  # [N, K/32]
    if kind == T.Q4_0:
        qs = blocks[..., 2:]
        m = d * -8.0
    else:
        qs = blocks[..., 4:]
        m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1)
    # Low nibbles are a block's first 16 values, high nibbles its last 16.
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).reshape(n, -1)
    return q, d, m
