"""Linear layers on a GGUF file's own quantized blocks, run as stored: Q4_0, Q4_1, Q8_0, Q4_K,
Q5_K and Q6_K (so Q4_0, Q4_K_M, Q5_K_M, Q6_K and Q8_0 files, and their mixes, need no int8 or
float copy). The weights are the file's bytes, [out_features, row_bytes] uint8, one row of
blocks per output channel (GGUF's row-major order for a [out, in] matrix).

The compiled kernel (kernels/gguf_blocks.cpp, `torch.ops.surge.gguf_linear`) rounds the
activations to int8 per block of 32 (llama.cpp's Q8_0 scheme with a float32 scale, for the
K-quants too) and takes integer dot products with the blocks; its result is the file's weights
times the rounded activations. Without the kernels (no toolchain, CUDA) the blocks are
dequantized (bit-exact against the gguf package's `gguf.quants.dequantize`) and multiplied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from surge.models.kernels import GGUF_BLOCKS, load_gguf_blocks

# GGML type ids (gguf.GGMLQuantizationType) of the formats served here.
GGML_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
_NAMES = {v: k for k, v in GGML_TYPES.items()}
_CHUNK_ROWS = 256  # the torch dequantization's rows at a time: bounded temporaries


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one row of `in_features` weights of GGML type `qtype`."""
    if qtype not in GGUF_BLOCKS:
        raise ValueError(f"GGML type {qtype} is not one of {sorted(_NAMES.values())}")
    weights, size = GGUF_BLOCKS[qtype]
    if in_features % weights:
        raise ValueError(
            f"{_NAMES[qtype]} needs in_features divisible by {weights}, got {in_features}"
        )
    return in_features // weights * size


def _f16(b: Tensor, at: int) -> Tensor:
    """The float16 at byte `at` of each block of `b` [..., blocks, size], as float32 [..., 1]."""
    return b[..., at : at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: Tensor) -> Tensor:
    """[..., 16 * j] bytes -> [..., 2, 16 * j]: the low nibbles, then the high."""
    return torch.stack([qs & 0x0F, qs >> 4], dim=-2)


def _k_scales(s: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K/Q5_K's 12 bytes [..., 12] -> the 8 sub-blocks' 6-bit scales and mins [..., 8]."""
    s = s.int()
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([lo & 63, (hi & 0x0F) | ((lo >> 6) << 4)], dim=-1)
    mn = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc, mn


def _dequantize_chunk(b: Tensor, qtype: int) -> Tensor:
    """b [n, blocks, size] uint8 -> [n, blocks * weights] float32, computed as gguf does (the
    float16 scale times the integer scale first, then times q, then the offset)."""
    n, nb = b.shape[0], b.shape[1]
    if qtype in (2, 3):  # Q4_0, Q4_1
        d = _f16(b, 0)
        q = _nibbles(b[..., 4 if qtype == 3 else 2 :]).reshape(n, nb, 32).float()
        out = d * (q - 8) if qtype == 2 else d * q + _f16(b, 2)
    elif qtype == 8:  # Q8_0
        out = b[..., 2:].contiguous().view(torch.int8).float() * _f16(b, 0)
    elif qtype in (12, 13):  # Q4_K, Q5_K
        sc, mn = _k_scales(b[..., 4:16])
        a = (_f16(b, 0) * sc.float())[..., None]
        off = (_f16(b, 2) * mn.float())[..., None]
        qs = b[..., 16:] if qtype == 12 else b[..., 48:]
        q = _nibbles(qs.reshape(n, nb, 4, 32)).reshape(n, nb, 8, 32)
        if qtype == 13:
            shifts = torch.arange(8, dtype=torch.uint8).reshape(8, 1)
            q = q | (((b[..., None, 16:48] >> shifts) & 1) << 4)
        out = a * q.float() - off
    elif qtype == 14:  # Q6_K
        low = _nibbles(b[..., 0:128].reshape(n, nb, 2, 64)).reshape(n, nb, 2, 128)
        shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(4, 1)
        high = ((b[..., 128:192].reshape(n, nb, 2, 1, 32) >> shifts) & 3).reshape(n, nb, 2, 128)
        q = ((low | (high << 4)).int() - 32).reshape(n, nb, 16, 16)
        a = _f16(b, 208) * b[..., 192:208].contiguous().view(torch.int8).float()
        out = a[..., None] * q.float()
    else:
        raise ValueError(f"GGML type {qtype} is not one of {sorted(_NAMES.values())}")
    return out.reshape(n, -1)


def dequantize_blocks(blocks: Tensor, qtype: int) -> Tensor:
    """[N, row_bytes] uint8 blocks of GGML type `qtype` -> [N, K] float32, in torch ops
    (bit-exact against gguf.quants.dequantize, as the compiled gguf_dequantize is)."""
    weights, size = GGUF_BLOCKS[qtype]
    n, nbytes = blocks.shape
    if nbytes % size:
        raise ValueError(f"{nbytes} bytes a row is not a whole number of {size}-byte blocks")
    out = torch.empty(n, nbytes // size * weights, dtype=torch.float32, device=blocks.device)
    for r in range(0, n, _CHUNK_ROWS):
        chunk = blocks[r : r + _CHUNK_ROWS].reshape(-1, nbytes // size, size)
        out[r : r + _CHUNK_ROWS] = _dequantize_chunk(chunk, qtype)
    return out


class GGUFLinear(nn.Module):
    """A linear layer on a GGUF file's quantized blocks as stored (see the module doc).

    `blocks` [out_features, row_bytes] uint8 is held as given (a view of a mapped file stays
    one: no copy, unless it is not contiguous). On the CPU with the kernels every batch size
    takes the block kernel (integer products; whether dequantize + float matmul wins for
    large batches is benchmarks/bench_gguf_kernel.py's deq+mm column, not yet measured on a
    quiet machine); elsewhere the blocks are dequantized and multiplied."""

    blocks: Tensor
    bias: Tensor | None

    def __init__(
        self,
        blocks: Tensor,
        qtype: int,
        out_features: int,
        in_features: int,
        bias: Tensor | None = None,
        kernels: bool | None = None,
    ) -> None:
        super().__init__()
        expected = (out_features, row_bytes(qtype, in_features))
        if blocks.dtype != torch.uint8 or tuple(blocks.shape) != expected:
            raise ValueError(
                f"{_NAMES[qtype]} blocks of a [{out_features}, {in_features}] weight must be "
                f"uint8 {list(expected)}, got {blocks.dtype} {list(blocks.shape)}"
            )
        if bias is not None and bias.numel() != out_features:
            raise ValueError(f"bias has {bias.numel()} values, expected {out_features}")
        self.qtype = qtype
        self.out_features, self.in_features = out_features, in_features
        self.kernels = load_gguf_blocks() is not None if kernels is None else kernels
        self.register_buffer("blocks", blocks.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    @property
    def type_name(self) -> str:
        return _NAMES[self.qtype]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"{self.type_name}, bias={self.bias is not None}"
        )

    def _kernel_ok(self, x: Tensor) -> bool:
        return (
            self.kernels
            and x.device.type == "cpu"
            and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
        )

    def forward(self, x: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
        """[..., in_features] -> [..., out_features] in `out_dtype` (default: x's dtype)."""
        dtype = out_dtype or x.dtype
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self._kernel_ok(x2):
            out: Tensor = torch.ops.surge.gguf_linear(x2, self.blocks, self.qtype, self.bias)
        else:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            out = F.linear(x2, self.dequantize(x.dtype), bias)
        return out.to(dtype).reshape(*lead, self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weights as [out_features, in_features] in `dtype` (the file's values exactly in
        float32)."""
        if self.kernels and self.blocks.device.type == "cpu":
            w: Tensor = torch.ops.surge.gguf_dequantize(self.blocks, self.qtype)
        else:
            w = dequantize_blocks(self.blocks, self.qtype)
        return w.to(dtype)


class GGUFSegments(nn.Module):
    """A stacked matrix whose parts are stored in different GGML types (a Q4_K_M file's fused
    q/k/v with v in Q6_K), each part run on its own blocks into its slice of the output: one
    rounding of the activations serves every part (`torch.ops.surge.gguf_linear_parts`), no
    int8 or float copy. `parts`: GGUFLinear layers of one in_features, without bias; `bias`
    covers the whole stack."""

    bias: Tensor | None

    def __init__(
        self, parts: list[GGUFLinear], bias: Tensor | None = None, kernels: bool | None = None
    ) -> None:
        super().__init__()
        widths = {p.in_features for p in parts}
        if not parts or len(widths) != 1 or any(p.bias is not None for p in parts):
            raise ValueError("GGUFSegments takes GGUFLinear parts of one width, without bias")
        self.in_features = widths.pop()
        self.out_features = sum(p.out_features for p in parts)
        if bias is not None and bias.numel() != self.out_features:
            raise ValueError(f"bias has {bias.numel()} values, expected {self.out_features}")
        self.parts = nn.ModuleList(parts)
        self.kernels = all(p.kernels for p in parts) if kernels is None else kernels
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def segments(self) -> list[GGUFLinear]:
        return [p for p in self.parts if isinstance(p, GGUFLinear)]

    @property
    def type_name(self) -> str:
        return "+".join(p.type_name for p in self.segments())

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"{self.type_name}, bias={self.bias is not None}"
        )

    def forward(self, x: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
        """[..., in_features] -> [..., out_features] in `out_dtype` (default: x's dtype)."""
        dtype = out_dtype or x.dtype
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        parts = self.segments()
        if (
            self.kernels
            and x2.device.type == "cpu"
            and x2.dtype in (torch.float32, torch.bfloat16, torch.float16)
        ):
            blocks = [p.blocks for p in parts]
            types = [p.qtype for p in parts]
            out: Tensor = torch.ops.surge.gguf_linear_parts(x2, blocks, types, self.bias)
        else:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            out = F.linear(x2, self.dequantize(x.dtype), bias)
        return out.to(dtype).reshape(*lead, self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The stacked weights as [out_features, in_features] in `dtype`."""
        return torch.cat([p.dequantize(dtype) for p in self.segments()])
