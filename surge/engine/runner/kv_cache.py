"""The KV block pool: how many blocks fit in the memory budget, and the per-layer tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from surge.engine.runner import huge_pages
from surge.models.formats.spec import ModelSpec
from surge.models.kv_quant import row_size


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


# The KV budget where none is named: a fixed one on a CPU (it shares RAM with everything else),
# and on a GPU what --gpu-memory-utilization leaves after the weights and a step's transients.
CPU_KV_CACHE_GIB = 2.0
# Besides a step's tensors: the CUDA context's allocations outside torch, the captured decode
# graphs' pool and the allocator's fragmentation.
GPU_FIXED_RESERVE_BYTES = 512 << 20


def step_transient_bytes(spec: ModelSpec, tokens: int, rows: int) -> int:
    """A generous bound on one step's transient GPU memory: float32 hidden states, q/k/v and
    MLP intermediates for `tokens` tokens, float32 logits of `rows` rows with the sampler's
    copies, and GPU_FIXED_RESERVE_BYTES."""
    qkv = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    per_token = 4 * (6 * spec.hidden_size + 3 * spec.intermediate_size + qkv)
    logits = 4 * 4 * rows * spec.vocab_size
    return tokens * per_token + logits + GPU_FIXED_RESERVE_BYTES


def gpu_kv_budget_bytes(
    total: int, free: int, weight_bytes: int, transient_bytes: int, utilization: float
) -> int:
    """vLLM's --gpu-memory-utilization: this instance may hold `utilization` of the GPU's
    memory (weights, a step's transients and the KV cache), and no more than is free now
    (another process's memory is not ours to take). What is left for the KV cache; <= 0 when
    nothing is."""
    allowed = min(int(utilization * total), free)
    return allowed - weight_bytes - transient_bytes


# A CPU's KV cache takes at most this share of the memory free after the weights (the rest is
# the OS's, the page cache's, a step's transients), up to CPU_KV_CACHE_GIB; never below the floor.
CPU_KV_FREE_SHARE = 0.5
CPU_KV_FLOOR_BYTES = 64 << 20


def cpu_kv_budget_bytes(available: int, weight_bytes: int) -> int:
    """The KV budget on a CPU: CPU_KV_CACHE_GIB, or less where the memory available now, less
    the weights still to load, is short (an 8B on a small machine)."""
    share = int(CPU_KV_FREE_SHARE * (available - weight_bytes))
    return max(CPU_KV_FLOOR_BYTES, min(int(CPU_KV_CACHE_GIB * (1 << 30)), share))


def kv_bytes_per_token(spec: ModelSpec, dtype: torch.dtype) -> int:
    """K and V, every layer, one token (an int8 row with its scale)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * spec.num_layers * spec.num_kv_heads * row_size(spec.head_dim, dtype) * elem


def plan_kv_cache(
    spec: ModelSpec,
    dtype: torch.dtype,
    block_size: int,
    memory_gib: float,
    num_blocks: int | None = None,
) -> KVCachePlan:
    per_block = block_size * kv_bytes_per_token(spec, dtype)
    if num_blocks is None:
        num_blocks = int(memory_gib * (1 << 30)) // per_block
    if num_blocks < 1:
        raise ValueError(f"KV cache budget of {memory_gib} GiB holds no block of {per_block} bytes")
    return KVCachePlan(num_blocks, block_size, per_block)


def allocate_kv_cache(
    spec: ModelSpec, plan: KVCachePlan, dtype: torch.dtype, device: torch.device
) -> list[tuple[Tensor, Tensor]]:
    """Per layer (k, v), each [num_kv_heads, num_blocks + 1, block_size, head_dim] (int8:
    head_dim + 4, each row's values then its scale), zeroed; on a Linux CPU on huge pages
    (huge_pages.py: a request's blocks lie anywhere in the pool).

    The extra last block belongs to no request: padded rows of a compiled step write there.
    """
    row = row_size(spec.head_dim, dtype)
    shape = (spec.num_kv_heads, plan.num_blocks + 1, plan.block_size, row)
    return [
        (
            huge_pages.zeros(shape, dtype, device),
            huge_pages.zeros(shape, dtype, device),
        )
        for _ in range(spec.num_layers)
    ]


def copy_blocks(kv_caches: list[tuple[Tensor, Tensor]], copies: Sequence[tuple[int, int]]) -> None:
    """Copy whole blocks (source, destination), every layer's K and V, in order: one indexed
    copy per tensor, or one per pair where a destination is also a later source."""
    if not copies:
        return
    src, dst = zip(*copies, strict=True)
    groups = [copies] if not set(src) & set(dst) else [[c] for c in copies]
    device = kv_caches[0][0].device
    for group in groups:
        s = torch.tensor([c[0] for c in group], device=device)
        d = torch.tensor([c[1] for c in group], device=device)
        for k, v in kv_caches:
            k[:, d] = k[:, s]
            v[:, d] = v[:, s]


# A request's average context (prompt + output) for the recommendation below, and the cap: on a
# 2-core CPU a step is compute-bound well before 256 requests (benchmarks/bench_engine.py gains
# 7% from 64 to 256), and on a GPU a larger batch is a scheduler choice, not a memory one.
AVERAGE_CONTEXT_TOKENS = 1024
MAX_RECOMMENDED_SEQS = 256


def recommend_max_num_seqs(num_tokens: int, max_model_len: int | None = None) -> int:
    """Requests that fit in `num_tokens` of KV cache at an average context of 1024 tokens (or
    the context limit, if shorter), at least 1 and at most 256."""
    avg = min(AVERAGE_CONTEXT_TOKENS, max_model_len or AVERAGE_CONTEXT_TOKENS)
    return max(1, min(MAX_RECOMMENDED_SEQS, num_tokens // avg))
