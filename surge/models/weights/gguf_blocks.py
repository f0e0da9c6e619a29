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
