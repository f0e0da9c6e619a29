"""Scoring a text with a built model: per-token log-probabilities and perplexity.

Runs the model's own prefill path (paged attention over a private KV cache, chunked like the
engine's steps), so what is measured is what serves: the dtype, the KV cache dtype and, with
quantization, the kernel that a chunk of this many rows selects.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from surge.models.attention import AttnMetadata, PrefillChunk
from surge.models.kv_quant import row_size
from surge.models.llama import LlamaForCausalLM


@torch.inference_mode()
def score(
    model: LlamaForCausalLM,
    token_ids: list[int],
    kv_dtype: torch.dtype | None = None,
    chunk_size: int = 512,
    block_size: int = 16,
) -> tuple[Tensor, Tensor]:
    """For i >= 1: log p(token_i | tokens before i) [n - 1] float32, and the greedy choice after
    tokens before i [n - 1] long (teacher forcing: the prefix is always the given text)."""
    spec = model.spec
    device = model.norm.weight.device
    n = len(token_ids)
    num_blocks = (n + block_size - 1) // block_size
    dtype = kv_dtype or model.norm.weight.dtype
    shape = (spec.num_kv_heads, num_blocks, block_size, row_size(spec.head_dim, dtype))
    caches = [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(spec.num_layers)
    ]
    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    table = torch.arange(num_blocks, device=device)
    logprobs: list[Tensor] = []
    greedy: list[Tensor] = []
    for start in range(0, n, chunk_size):
        end = min(n, start + chunk_size)
        rows = end - start
        attn = AttnMetadata(
            slot_mapping=torch.arange(start, end, device=device),  # blocks in order: slot = pos
            decode_block_tables=torch.zeros((0, 1), dtype=torch.long, device=device),
            decode_seq_lens=torch.zeros(0, dtype=torch.long, device=device),
            decode_bias=torch.zeros((0, 1, block_size), device=device),
            prefills=(PrefillChunk(0, rows, start, table[: (end + block_size - 1) // block_size]),),
            logits_indices=torch.arange(rows, device=device),
            kv_caches=caches,
        )
        logits = model(ids[start:end], torch.arange(start, end, device=device), attn)
        # Row i predicts token start + i + 1.
        targets = ids[start + 1 : end + 1]
        logits = logits[: targets.numel()].float()  # [rows', vocab]
        logp = torch.log_softmax(logits, dim=-1)
        logprobs.append(logp.gather(1, targets[:, None]).squeeze(1))
        greedy.append(logits.argmax(dim=-1))
    return torch.cat(logprobs), torch.cat(greedy)


def token_logprobs(
    model: LlamaForCausalLM,
    token_ids: list[int],
    kv_dtype: torch.dtype | None = None,
    chunk_size: int = 512,
) -> Tensor:
    """[len(token_ids) - 1] float32: log p(token_i | tokens before i), for i >= 1. A small
    chunk_size (8) runs the kernels a decode step runs, which differ under quantization."""
    return score(model, token_ids, kv_dtype, chunk_size)[0]


def perplexity(logprobs: Tensor) -> float:
    return math.exp(-logprobs.double().mean().item())
