"""Weights from a GGUF file, renamed to HF parameter names: as matrix sources over the file's
blocks (the streaming build), or dequantized to float32."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TypeVar

import gguf
import numpy as np
import torch

from surge.models.formats.gguf_file import GGUFSource
from surge.models.formats.spec import ModelSpec
from surge.models.weights.gguf_blocks import dequantize_blocks
from surge.models.weights.source import GGUFMatrix, MatrixSource

T = TypeVar("T", torch.Tensor, np.ndarray)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    # Gemma 3 (llama.cpp stores its norms with Gemma's +1 already added)
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attn_norm.weight",
    "post_ffw_norm.weight": "post_mlp_norm.weight",
}
# Phi-3 keeps q/k/v and gate/up fused, as the model's own projections are.
_FUSED_NAMES = {
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
# Already folded into ModelSpec.rope_scaling, not model parameters.
_SKIPPED = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})


def hf_name(gguf_name: str, fused: bool = False) -> str:
    """HF parameter name for a llama.cpp tensor name, e.g. blk.3.attn_q.weight ->
    model.layers.3.self_attn.q_proj.weight; `fused`: a Phi-3 file (ffn_up is gate and up)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    names = {**_LAYER_NAMES, **_FUSED_NAMES} if fused else _LAYER_NAMES
    if match is None or match.group(2) not in names:
        raise ValueError(f"unsupported GGUF tensor {gguf_name!r}")
    return f"model.layers.{match.group(1)}.{names[match.group(2)]}"


def gguf_weights(reader: GGUFSource, spec: ModelSpec) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 tensor in HF shape) for every parameter in the file."""
    for name, value in gguf_sources(reader, spec):
        yield name, value.dense() if isinstance(value, MatrixSource) else value


def gguf_sources(
    reader: GGUFSource, spec: ModelSpec
) -> Iterator[tuple[str, torch.Tensor | MatrixSource]]:
    """Yield (HF name, value) for every parameter in the file, nothing converted yet: each
    matrix as a GGUFMatrix over the file's blocks (rows in HF order), 1-D tensors in float32."""
    arch = reader.get_field("general.architecture")
    fused = arch is not None and arch.contents() == "phi3"
    # llama.cpp's converter permutes q/k rows for its Llama-style RoPE (SmolLM3 and Granite are
    # converted as Llamas); Qwen and Gemma use NeoX RoPE, unpermuted.
    permuted = arch is not None and arch.contents() in ("llama", "smollm3", "granite")
    for tensor in reader.tensors:
        if tensor.name in _SKIPPED:
            continue
        name = hf_name(tensor.name, fused)
        if len(tensor.shape) != 2:
            yield name, dequantize(tensor)
            continue
        heads = 0
        if permuted and ".self_attn.q_proj." in name:
            heads = spec.num_heads
        elif permuted and ".self_attn.k_proj." in name:
            heads = spec.num_kv_heads
        rows = int(tensor.shape[1])
        order = unpermute_rope_rows(np.arange(rows), heads) if heads else None
        yield name, GGUFMatrix(tensor, order)


def file_kinds(reader: GGUFSource) -> dict[str, str]:
    """HF name -> GGML type name of every matrix in the file (what forms.py decides by)."""
    arch = reader.get_field("general.architecture")
    fused = arch is not None and arch.contents() == "phi3"
    return {
        hf_name(t.name, fused): t.tensor_type.name
        for t in reader.tensors
        if t.name not in _SKIPPED and len(t.shape) == 2
    }


def dequantize(tensor: gguf.ReaderTensor) -> torch.Tensor:
    """Float32 copy of a GGUF tensor, shaped [rows, cols] like PyTorch (GGUF lists dims
    innermost first)."""
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    fast = dequantize_blocks(tensor.data, tensor.tensor_type)
    if fast is not None:
        return fast.reshape(shape)
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    # Copy out of the read-only memory map so torch owns writable memory.
    array = np.require(values, dtype=np.float32, requirements=["C", "W"])
    return torch.from_numpy(array).reshape(shape)


def unpermute_rope_rows(weight: T, n_heads: int) -> T:
    """Undo llama.cpp's row permutation: within each head, GGUF interleaves the two rotary
    halves (pairs), HF keeps them as two contiguous halves (rotate_half). On np.arange(rows):
    which file row each HF row is."""
    rows = weight.shape[0]
    if rows % (2 * n_heads) != 0:
        raise ValueError(f"cannot un-permute {rows} rows into {n_heads} heads")
    # [heads, head_dim/2, 2, ...] -> [heads, 2, head_dim/2, ...]
    split = weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:])
    if isinstance(split, np.ndarray):
        return np.ascontiguousarray(split.swapaxes(1, 2).reshape(weight.shape))
    return split.transpose(1, 2).reshape(weight.shape).contiguous()
