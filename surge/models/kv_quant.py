"""An int8 KV cache (`--kv-cache-dtype int8`): a quarter of float32's bytes, half of bf16's.

Each cached row (one token's K or V for one KV head) is its head_dim values in int8 and then
its float32 scale in 4 more bytes, in the row: value = int8 * scale, scale = max |value| / 127.
A scale per row (llama.cpp's q8_0 cache keeps one per 32 values) follows the outliers of one
token and head, not the whole cache's (vLLM's fp8 cache with a per-tensor scale). The rows keep
the block layout of a float cache, so block tables, prefix caching, swapping and the gathers
work unchanged; the kernels (decode_attention.h) scale a key's dot product and a value's
softmax weight instead of widening rows. The rounding here is the C++ path's (quantize_kv_row),
so a row is the same whichever path wrote it.
"""

from __future__ import annotations

import torch
from torch import Tensor

SCALE_BYTES = 4  # the row's float32 scale, after its values


def row_size(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one cached row."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def quantize_rows(x: Tensor) -> Tensor:
    """[..., head_dim] -> [..., head_dim + 4] int8: the values, then the row's scale's bytes."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    mult = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    values = torch.round(x * mult).clamp_(-127, 127).to(torch.int8)
    scale = (amax / 127.0).contiguous()
    return torch.cat([values, scale.view(torch.int8)], dim=-1)


def dequantize_rows(rows: Tensor, dtype: torch.dtype) -> Tensor:
    """[..., head_dim + 4] int8 -> [..., head_dim] of `dtype`."""
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float32)  # [..., 1]
    return (rows[..., :-SCALE_BYTES].float() * scale).to(dtype)
