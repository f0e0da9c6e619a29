"""The KV block pool: how many blocks fit in the memory budget, and the per-layer tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from surge.models.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class KVCachePlan:
    num_blocks: int
    block_size: int
    bytes_per_block: int

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def total_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block


def plan_kv_cache(
    spec: ModelSpec,
    dtype: torch.dtype,
    block_size: int,
    memory_gib: float,
    num_blocks: int | None = None,
) -> KVCachePlan:
    elem = torch.empty((), dtype=dtype).element_size()
    # K and V, every layer, every slot of the block.
    per_block = 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * elem
    if num_blocks is None:
        num_blocks = int(memory_gib * (1 << 30)) // per_block
    if num_blocks < 1:
        raise ValueError(f"KV cache budget of {memory_gib} GiB holds no block of {per_block} bytes")
    return KVCachePlan(num_blocks, block_size, per_block)


def allocate_kv_cache(
    spec: ModelSpec, plan: KVCachePlan, dtype: torch.dtype, device: torch.device
) -> list[tuple[Tensor, Tensor]]:
    """Per layer (k, v), each [num_kv_heads, num_blocks, block_size, head_dim], zeroed."""
    shape = (spec.num_kv_heads, plan.num_blocks, plan.block_size, spec.head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(spec.num_layers)
    ]
