"""4-bit weights in blocks of 32 along the input dimension, GGUF's Q4_1 scheme:

    w[n, k] = d[n, b] * q[n, k] + m[n, b],   q in 0..15,  b = k // 32,  d and m float16

Quantizing by each block's min and max recovers a Q4_1 GGUF file's blocks exactly from their
dequantized values (each block's min is m and its max is d * 15 + m), so a model shipped as Q4_1
runs on the weights the file holds, with no second rounding. Stored repacked for the kernel
(see kernels/q4_linear.cpp): qs [N, K/2] uint8, groups of 16 blocks interleaved so that each
int32 lane of the dot-product instruction sums one block, then pairs of blocks (byte j =
q[j] | q[32 + j] << 4); dm [N, 2, K/32] float16, each block's d then m.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from surge.models.quant import GEMV_MAX_ROWS, NO_VNNI_GEMV_MAX_ROWS, Int8Linear, cpu_int8_fast

BLOCK = 32
GROUP = 512  # 16 blocks, interleaved
K_MULTIPLE = 64  # whole pairs of blocks: layers of other widths stay int8 only


def quantize_q4(weight: Tensor) -> tuple[Tensor, Tensor]:
    """[N, K] float -> (qs uint8 [N, K/2], dm float16 [N, 2, K/32])."""
    n, k = weight.shape
    if k % K_MULTIPLE:
        raise ValueError(f"q4 needs in_features divisible by {K_MULTIPLE}, got {k}")
    w = weight.float().reshape(n, k // BLOCK, BLOCK)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    # Round d and m to float16 first and quantize against what dequantization will use.
    d = ((hi - lo) / 15).half()
    m = lo.half()
    df, mf = d.float()[..., None], m.float()[..., None]
    q = torch.where(df > 0, (w - mf) / df.clamp(min=torch.finfo(torch.float32).tiny), 0.0)
    q = q.round().clamp_(0, 15).to(torch.uint8).reshape(n, k)
    return _pack(q), torch.stack([d, m], dim=1).contiguous()


def dequantize_q4(qs: Tensor, dm: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Inverse of `quantize_q4`: [N, K] in `dtype`."""
    n, k = qs.shape[0], qs.shape[1] * 2
    q = _unpack(qs).float().reshape(n, k // BLOCK, BLOCK)
    d, m = dm[:, 0].float(), dm[:, 1].float()
    return (q * d[..., None] + m[..., None]).reshape(n, k).to(dtype)


def _pack(q: Tensor) -> Tensor:
    """q [N, K] uint8 in 0..15, natural order -> [N, K/2] in the kernel's layout."""
    n, k = q.shape
    groups = k // GROUP
    # Group: operand j's byte 4l + i holds weight 4j + i of block l.
    g = q[:, : groups * GROUP].reshape(n, groups, 16, 8, 4).permute(0, 1, 3, 2, 4)
    pairs = q[:, groups * GROUP :].reshape(n, -1, 64)
    operands = torch.cat([g.reshape(n, groups * 8, 64), pairs], dim=1)
    return (operands[..., :32] | (operands[..., 32:] << 4)).reshape(n, k // 2).contiguous()


def pack_block_bytes(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """GGUF Q4_0/Q4_1 quant bytes [N, K/32, 16] (byte i: value i in the low nibble, i + 16 in
    the high) -> [N, K/2] (into `out` if given) in the kernel's layout: `_pack` of their
    values, made with byte masks and shifts on the bytes as they are (no unpacked copy). In
    numpy: its uint8 bitwise ops are vectorized, ~5x torch's here (8B Q4_0: 32 s, was 348)."""
    n, blocks = x.shape[0], x.shape[1]
    groups = blocks // 16
    if out is None:
        out = np.empty((n, blocks * 16), dtype=np.uint8)
    # A group's operand j, byte 4l + i: value 4j + i of block l (low nibble), of block l + 8
    # (high); values 0-15 are low nibbles of bytes 0-15, 16-31 high nibbles.
    g = x[:, : groups * 16].reshape(n, groups, 2, 8, 4, 4)
    a, b = g[:, :, 0], g[:, :, 1]  # blocks l and l + 8: [N, groups, l, j, i]
    grouped = out[:, : groups * 256].reshape(n, groups, 2, 4, 8, 4)  # [.., half, j, l, i]
    grouped[:, :, 0] = ((a & 0x0F) | (b << 4)).transpose(0, 1, 3, 2, 4)
    grouped[:, :, 1] = ((a >> 4) | (b & 0xF0)).transpose(0, 1, 3, 2, 4)
    # Pairs of blocks after the groups: byte j = value j | value 32 + j << 4.
    p = x[:, groups * 16 :].reshape(n, -1, 2, 16)
    a2, b2 = p[:, :, 0], p[:, :, 1]
    pairs = out[:, groups * 256 :].reshape(n, -1, 2, 16)
    pairs[:, :, 0] = (a2 & 0x0F) | (b2 << 4)
    pairs[:, :, 1] = (a2 >> 4) | (b2 & 0xF0)
    return out


def _unpack(qs: Tensor) -> Tensor:
    n, k = qs.shape[0], qs.shape[1] * 2
    groups = k // GROUP
    packed = qs.reshape(n, k // 64, 32)
    operands = torch.cat([packed & 0x0F, packed >> 4], dim=-1)  # [N, K/64, 64]
    g = operands[:, : groups * 8].reshape(n, groups, 8, 16, 4).permute(0, 1, 3, 2, 4)
    return torch.cat([g.reshape(n, groups * GROUP), operands[:, groups * 8 :].reshape(n, -1)], 1)


class Q4Linear(nn.Module):
    """A linear layer with 4-bit block weights (0.625 bytes a weight). With the compiled
    kernel (`torch.ops.surge.q4_gemv`: int8 activations per block, VNNI or AVX2 dot products)
    every batch size reads them; without it, they are dequantized for a float matmul.

    `int8`: an optional int8 copy of the same layer for batches past GEMV_MAX_ROWS (the
    "q4-int8" quantization): on a CPU with VNNI/AMX int8 W8A8 is ~1.6x faster than the block
    kernel at 64 rows (benchmarks/bench_q4_kernel.py --rows 64), at 1.0 more byte a weight
    (1.625 in all). Without VNNI (AVX2) the 4-bit kernel is the faster one up to
    NO_VNNI_GEMV_MAX_ROWS rows, so there it serves those even where the copy is held."""

    qs: Tensor
    dm: Tensor
    bias: Tensor | None

    def __init__(
        self,
        qs: Tensor,
        dm: Tensor,
        bias: Tensor | None = None,
        kernels: bool = False,
        int8: Int8Linear | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = qs.shape[0], qs.shape[1] * 2
        self.register_buffer("qs", qs.contiguous())
        self.register_buffer("dm", dm.contiguous())
        self.register_buffer("bias", None if bias is None else bias.float().contiguous())
        self.int8 = int8
        self.kernels = kernels
        # Without VNNI the 4-bit kernel (AVX2) outruns every int8 path up to ~512 rows
        # (3072x576, 64 rows: 2.1 ms against the int8 GEMV's 2.6 and dequantize + matmul's 4.4).
        self.gemv_max_rows = GEMV_MAX_ROWS if cpu_int8_fast() else NO_VNNI_GEMV_MAX_ROWS

    @classmethod
    def from_float(cls, linear: nn.Linear, kernels: bool, int8_copy: bool = False) -> Q4Linear:
        qs, dm = quantize_q4(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach()
        int8 = Int8Linear.from_float(linear, "int8", kernels) if int8_copy else None
        return cls(qs, dm, bias, kernels, int8)

    def extra_repr(self) -> str:
        copy = " + int8 copy" if self.int8 is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, q4{copy}"

    def set_bias(self, bias: Tensor) -> None:
        """The layer's bias, arriving after its weights (a streaming load)."""
        self.bias = bias.float().contiguous()
        if self.int8 is not None:
            self.int8.bias = self.bias

    def lookup(self, ids: Tensor) -> Tensor:
        """Rows `ids` of the weights in float32 (the layer as a tied embedding)."""
        return dequantize_q4(self.qs.index_select(0, ids), self.dm.index_select(0, ids))

    def forward(self, x: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
        dtype = out_dtype or x.dtype
        if self.int8 is not None and not (self.kernels and x.shape[0] <= self.gemv_max_rows):
            return self.int8(x, out_dtype)
        if self.kernels:
            out: Tensor = torch.ops.surge.q4_gemv(x, self.qs, self.dm, self.bias)
            return out.to(dtype)
        w = dequantize_q4(self.qs, self.dm, x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, w, bias).to(dtype)
