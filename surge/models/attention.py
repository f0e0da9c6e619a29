"""Paged attention: write each new token's K/V into its cache slot, attend through block tables.

The cache of one layer is a pair of tensors [num_kv_heads, num_blocks, block_size, head_dim]. A step
mixes decodes (one new token per request) with prefill chunks (many tokens per request). The runner
lays the step's tokens out decodes first, then prefill chunks, and describes both groups here:

    tokens:  | d0 d1 ... d(D-1) | p0 chunk ... | p1 chunk ... |
    decodes: one batched attention over gathered blocks, masked by length
    prefills: one attention per chunk, causal with an offset for the tokens already cached
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from surge.models.kv_quant import dequantize_rows, quantize_rows


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    query_start: int  # index of the chunk's first token in the step's token layout
    query_len: int
    start_pos: int  # tokens of this request already in the cache before this chunk
    block_table: Tensor  # [num_blocks_needed] long, covers start_pos + query_len tokens


@dataclass(frozen=True, slots=True)
class AttnMetadata:
    """Everything attention needs for one step, passed explicitly (no global context)."""

    slot_mapping: Tensor  # [num_tokens] long: cache slot (block_id * block_size + offset) per token
    decode_block_tables: Tensor  # [num_decodes, max_blocks] long, padded with block 0
    decode_seq_lens: Tensor  # [num_decodes] long: tokens in cache incl. this step's token
    # [num_decodes, 1, max_blocks * block_size] float: 0 attend, -inf not (torch-ops path only)
    decode_bias: Tensor
    prefills: tuple[PrefillChunk, ...]
    logits_indices: Tensor  # [num_sampled] long: rows of the hidden states that need logits
    kv_caches: Sequence[tuple[Tensor, Tensor]]  # per layer (k, v)
    # Compiled paged decode (q, k_cache, v_cache, block_tables, seq_lens, scale) -> out; None:
    # the torch-ops path (gather blocks, then batched matmuls).
    decode_op: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, float], Tensor] | None = None
    # Compiled (k, v, k_cache, v_cache, slot_mapping) -> None that writes the caches in place;
    # None: index_copy_ in torch ops.
    write_kv_op: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None] | None = None
    # decode_bias for sliding-window layers, also 0 only on each row's last `window` keys; None
    # when no decode row is longer than the window (the whole-context path then serves).
    decode_bias_window: Tensor | None = None

    @property
    def num_decodes(self) -> int:
        """The first num_decodes tokens are decodes, one per request. A tensor's size: under
        torch.compile it can be a dynamic dimension, where an int field would be specialized
        (a recompile per batch size)."""
        return self.decode_seq_lens.shape[0]


def paged_attention(
    layer: int,
    q: Tensor,  # [num_tokens, num_heads, head_dim]
    k: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: Tensor,  # [num_tokens, num_kv_heads, head_dim]
    attn: AttnMetadata,
    scale: float,
    window: int | None = None,  # a sliding-window layer: each query sees its last `window` keys
) -> Tensor:  # [num_tokens, num_heads * head_dim]
    k_cache, v_cache = attn.kv_caches[layer]  # [kv_heads, num_blocks, block_size, row]
    num_kv_heads, num_blocks, block_size, row = k_cache.shape  # row: head_dim (+ 4: int8)
    # A cache dtype of its own: attend to what the cache holds, fresh or cached, so that a
    # prefix-cache hit, a chunk boundary or a recompute after preemption gives the same
    # numbers as one pass.
    if k_cache.dtype == torch.int8:  # rows of int8 values and their scales (kv_quant.py)
        k_rows, v_rows = quantize_rows(k), quantize_rows(v)
        if any(chunk.start_pos == 0 for chunk in attn.prefills):  # attended fresh, below
            k, v = dequantize_rows(k_rows, q.dtype), dequantize_rows(v_rows, q.dtype)
    else:
        if k.dtype != k_cache.dtype:
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        k_rows, v_rows = k, v
    if attn.write_kv_op is not None:
        attn.write_kv_op(k_rows, v_rows, k_cache, v_cache, attn.slot_mapping)
    else:
        # Head-major layout: a request's gathered blocks are a contiguous [kv_heads, L, row].
        flat_k = k_cache.view(num_kv_heads, num_blocks * block_size, row)
        flat_v = v_cache.view(num_kv_heads, num_blocks * block_size, row)
        flat_k.index_copy_(1, attn.slot_mapping, k_rows.transpose(0, 1))
        flat_v.index_copy_(1, attn.slot_mapping, v_rows.transpose(0, 1))

    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    d = attn.num_decodes
    if d:
        windowed = window is not None and attn.decode_bias_window is not None
        out[:d] = _decode_attention(q[:d], k_cache, v_cache, attn, scale, group, windowed)
    for chunk in attn.prefills:
        rows = slice(chunk.query_start, chunk.query_start + chunk.query_len)
        if chunk.start_pos == 0:
            # Nothing cached before this chunk: attend to the fresh K/V directly (no gather).
            kf, vf = k[rows].transpose(0, 1), v[rows].transpose(0, 1)  # [kv_heads, Lq, head_dim]
            out[rows] = _prefill_attention(q[rows], kf, vf, 0, scale, group, window)
        else:
            kv_len = chunk.start_pos + chunk.query_len
            ks = _widen(k_cache.index_select(1, chunk.block_table), q.dtype)
            vs = _widen(v_cache.index_select(1, chunk.block_table), q.dtype)
            ks, vs = ks.flatten(1, 2)[:, :kv_len], vs.flatten(1, 2)[:, :kv_len]
            out[rows] = _prefill_attention(q[rows], ks, vs, chunk.start_pos, scale, group, window)
    return out.view(num_tokens, num_heads * head_dim)


def _decode_attention(
    q: Tensor,  # [D, num_heads, head_dim]
    k_cache: Tensor,  # [kv_heads, num_blocks, block_size, head_dim]
    v_cache: Tensor,
    attn: AttnMetadata,
    scale: float,
    group: int,
    windowed: bool = False,  # mask with decode_bias_window, in torch ops
) -> Tensor:  # [D, num_heads, head_dim]
    if attn.decode_op is not None and not windowed:
        # The op takes the query in the cache's dtype (a cache dtype of its own: cast and back;
        # float32 against an int8 cache).
        q_dtype = torch.float32 if k_cache.dtype == torch.int8 else k_cache.dtype
        out: Tensor = attn.decode_op(
            q.to(q_dtype).contiguous(),
            k_cache,
            v_cache,
            attn.decode_block_tables,
            attn.decode_seq_lens,
            scale,
        )
        return out.to(q.dtype)
    d, num_heads, head_dim = q.shape
    kvh = num_heads // group
    tables = attn.decode_block_tables.view(-1)  # [D * max_blocks]
    # One gather per cache gives [kv_heads, D * max_blocks, block_size, hd], contiguous;
    # index_select copies whole blocks, ~2x faster than advanced indexing on CPU.
    # A cache dtype of its own is widened here, after the gather: the matmuls run in the
    # query's dtype (bf16 ones are emulated, slowly, on CPUs without native bf16).
    ks = _widen(k_cache.index_select(1, tables), q.dtype).view(kvh * d, -1, head_dim)
    vs = _widen(v_cache.index_select(1, tables), q.dtype).view(kvh * d, -1, head_dim)
    # The `group` query heads sharing a KV head are `group` rows against the same keys.
    qg = q.view(d, kvh, group, head_dim).transpose(0, 1).reshape(kvh * d, group, head_dim)
    scores = torch.bmm(qg, ks.transpose(1, 2)).float() * scale  # [kv_heads * D, group, L]
    bias = attn.decode_bias_window if windowed else attn.decode_bias
    assert bias is not None
    scores = scores.view(kvh, d, group, -1) + bias  # bias [D, 1, L]: 0 or -inf
    probs = torch.softmax(scores, dim=-1).to(vs.dtype).view(kvh * d, group, -1)
    o = torch.bmm(probs, vs)  # [kv_heads * D, group, hd]
    return o.view(kvh, d, group, head_dim).transpose(0, 1).reshape(d, num_heads, head_dim)


def _widen(rows: Tensor, dtype: torch.dtype) -> Tensor:
    """Gathered cache rows as `dtype` values (an int8 cache's rows dequantized)."""
    return dequantize_rows(rows, dtype) if rows.dtype == torch.int8 else rows.to(dtype)


def _prefill_attention(
    q: Tensor,  # [Lq, num_heads, head_dim]
    k: Tensor,  # [kv_heads, Lk, head_dim], Lk = start_pos + Lq
    v: Tensor,
    start_pos: int,
    scale: float,
    group: int,
    window: int | None = None,
) -> Tensor:  # [Lq, num_heads, head_dim]
    lq = q.shape[0]
    lk = k.shape[1]
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, Lq, head_dim]
    kh = k.to(q.dtype).repeat_interleave(group, dim=0).unsqueeze(0)  # [1, heads, Lk, head_dim]
    vh = v.to(q.dtype).repeat_interleave(group, dim=0).unsqueeze(0)
    if start_pos == 0 and lq == lk and (window is None or lk <= window):
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    else:
        # Query i sits at absolute position start_pos + i and sees keys 0..start_pos + i (the
        # last `window` of them in a sliding-window layer).
        qpos = torch.arange(lq, device=q.device).unsqueeze(1) + start_pos
        kpos = torch.arange(lk, device=q.device).unsqueeze(0)
        mask = kpos <= qpos  # [Lq, Lk]
        if window is not None:
            mask &= kpos > qpos - window
        o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return o.squeeze(0).transpose(0, 1)
