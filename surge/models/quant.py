"""int8 weights with one scale per output channel, and the kernel chosen per batch shape.

    weight [N, K] float  ->  q [N, K] int8, scale [N] float32:  weight ~= q * scale[:, None]

Which matmul runs depends on M, the rows of the activation (tokens in the step):

    CPU with the compiled kernels, "int8" and "w8a8": every M takes W8A8 on weights packed at
                         load for the kernel (kernels/w8a8_gemm.h): activations quantized per
                         row (dynamic, with a zero point) inside the call, an int8 GEMM on VNNI,
                         the scales applied on the way out. 1.7-2.5x torch._int_mm with the two
                         ends around it at 16-64 rows; at 1 row within ~5% of the GEMV below.
    M <= gemv_max_rows   otherwise, weight-only GEMV: each int8 weight read once, widened and
                         multiplied into every row (compiled kernel on CPU). M = 1 is bound by
                         memory bandwidth, and int8 is 1/2 of bf16's bytes and 1/4 of fp32's.
    larger M, "int8"     W8A8 in torch ops: activations quantized per row, then an int8 x int8 ->
                         int32 GEMM (torch._int_mm: VNNI/AMX on CPU, IMMA on CUDA), scaled back
                         by scale_x[m] * scale_w[n] after subtracting zero_x[m] * sum_k q[n, k].
    larger M, "int8-weight-only"   the weight dequantized to the activation dtype, then a float
                         GEMM: no activation rounding, for accuracy comparisons.

"w8a8" takes the W8A8 path at every M.
"q4" keeps 4-bit block weights (GGUF's Q4_1 scheme, surge/models/q4.py) for every M; "q4-int8"
                         adds an int8 copy of each layer for large M; "gguf" keeps each matrix
                         in the form its GGML type maps to (surge/models/forms.py).
"""

from __future__ import annotations

import functools
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from surge.models.device import cpu_flags
from surge.models.kernels import load_w8a8_linear

QUANTIZATIONS = ("none", "int8", "int8-weight-only", "w8a8", "q4", "q4-int8", "gguf")
INT8_MODES = ("int8", "int8-weight-only", "w8a8")
# Measured on a 2-core AVX512-VNNI CPU (benchmarks/bench_precision.py --kernels): the GEMV beats
# quantize + _int_mm + dequantize up to 8 rows at SmolLM2's shapes.
GEMV_MAX_ROWS = 8
# Without VNNI or AMX (an AVX2 CPU) torch._int_mm runs a slow generic loop: 10-15x slower than
# the compiled GEMV at 16-512 rows (3072x576: 14.6 against 1.2 ms at 16 rows, 473 against
# 16.4 at 512). There the GEMV (AVX2 vpmaddwd) serves batches up to this many rows, beating
# dequantize + float32 matmul up to about here; larger ones dequantize.
NO_VNNI_GEMV_MAX_ROWS = 512
# torch._int_mm on CUDA wants more than 16 rows and dimensions that are multiples of 8.
_CUDA_INT_MM_MIN_ROWS = 17


@functools.cache
def cpu_int8_fast() -> bool:
    """Whether this CPU has int8 dot products (VNNI, AMX): torch._int_mm is fast only then."""
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """[N, K] float -> (int8 [N, K], float32 scales [N]); symmetric, round to nearest."""
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    return (q.float() * scale[:, None]).to(dtype)


def pack_int8(q: Tensor) -> Tensor:
    """int8 [N, K] -> [ceil(N/16), ceil(K/4), 16, 4], zero-padded: the layout of the compiled
    W8A8 GEMM (kernels/w8a8_gemm.h), where one 64-byte load is 16 channels x 4 inputs."""
    n, k = q.shape
    padded = torch.zeros((n + 15) // 16 * 16, (k + 3) // 4 * 4, dtype=torch.int8, device=q.device)
    padded[:n, :k] = q
    return padded.reshape(-1, 16, padded.shape[1] // 4, 4).permute(0, 2, 1, 3).contiguous()


def unpack_int8(packed: Tensor, n: int, k: int) -> Tensor:
    """Inverse of `pack_int8`: int8 [N, K]."""
    rows = packed.permute(0, 2, 1, 3).reshape(packed.shape[0] * 16, packed.shape[1] * 4)
    return rows[:n, :k].contiguous()


def quantize_rows_ref(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row dynamic asymmetric quantization in torch ops (the compiled kernel's reference):
    x [M, K] -> (int8 q, float32 scale [M], int32 zero [M]), x ~= scale * (q - zero). The range
    includes 0, so zero stays in [-128, 127]."""
    xf = x.float()
    lo = xf.amin(dim=1).clamp(max=0)
    hi = xf.amax(dim=1).clamp(min=0)
    scale = torch.where(hi > lo, (hi - lo) / 255.0, torch.ones_like(hi))
    zero = torch.round(-lo / scale) - 128
    q = (torch.round(xf / scale[:, None]) + zero[:, None]).clamp_(-128, 127).to(torch.int8)
    return q, scale, zero.to(torch.int32)


class Int8Linear(nn.Module):
    """A linear layer with int8 weights; `mode` picks the kernel per M (see the module doc)."""

    # [out_features, in_features] int8, or packed for the compiled W8A8 GEMM (pack_int8)
    weight: Tensor
    scale: Tensor  # [out_features] float32
    wsum: Tensor  # [out_features] int32: sum of each row of `weight`, for W8A8's zero points
    bias: Tensor | None

    def __init__(
        self,
        q: Tensor,
        scale: Tensor,
        bias: Tensor | None = None,
        mode: str = "int8",
        kernels: bool = False,
    ) -> None:
        super().__init__()
        if mode not in INT8_MODES:
            raise ValueError(f"unknown int8 mode {mode!r}")
        self.out_features, self.in_features = q.shape
        # Compiled CPU helpers loaded (torch.ops.surge.*); else (CUDA, no toolchain) torch ops.
        self.kernels = kernels
        # The packed GEMM serves every M of "int8" and "w8a8", so the weights are held in its
        # layout only; "int8-weight-only" keeps its row-major GEMV and float matmul.
        w8a8 = load_w8a8_linear() if kernels and mode != "int8-weight-only" else None
        self.packed = w8a8 is not None and bool(w8a8.supported)
        self.register_buffer("weight", pack_int8(q) if self.packed else q.contiguous())
        self.register_buffer("scale", scale.float().contiguous())
        self.register_buffer("wsum", q.sum(dim=1, dtype=torch.int32))
        self.register_buffer("bias", None if bias is None else bias.float())
        self.mode = mode
        # Read here, not in forward: torch.compile (fullgraph) cannot trace the /proc read.
        self.cpu_int8_fast = cpu_int8_fast()

    @classmethod
    def from_float(cls, linear: nn.Linear, mode: str = "int8", kernels: bool = False) -> Int8Linear:
        q, scale = quantize_int8(linear.weight.detach())
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(q, scale, bias, mode, kernels)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.mode}"

    def dense_weight(self) -> Tensor:
        """The int8 weights as [out_features, in_features], whatever their stored layout."""
        if self.packed:
            return unpack_int8(self.weight, self.out_features, self.in_features)
        return self.weight

    def rows(self, ids: Tensor) -> Tensor:
        """Rows `ids` of the int8 weights: [len(ids), in_features] (an embedding lookup)."""
        if not self.packed:
            return self.weight.index_select(0, ids)
        picked = self.weight[ids // 16, :, ids % 16, :]  # [n, K/4, 4]
        return picked.reshape(ids.shape[0], -1)[:, : self.in_features]

    def lookup(self, ids: Tensor) -> Tensor:
        """Rows `ids` of the weights in float32 (the layer as a tied embedding)."""
        return self.rows(ids).to(torch.float32) * self.scale.index_select(0, ids)[:, None]

    def path(self, rows: int) -> str:
        """The kernel that runs for `rows` activation rows: "packed", "gemv", "w8a8" or
        "dequant"."""
        if self.packed:
            return "packed"
        if self.weight.device.type == "cpu" and not self.cpu_int8_fast:
            gemv_rows = NO_VNNI_GEMV_MAX_ROWS if self.kernels else GEMV_MAX_ROWS
            return "gemv" if rows <= gemv_rows else "dequant"
        if self.mode == "w8a8" and self._int_mm_ok(rows):
            return "w8a8"
        if rows <= GEMV_MAX_ROWS:
            return "gemv"
        if self.mode == "int8" and self._int_mm_ok(rows):
            return "w8a8"
        return "dequant"

    def _int_mm_ok(self, rows: int) -> bool:
        if self.weight.device.type == "cuda":
            return rows >= _CUDA_INT_MM_MIN_ROWS and self.in_features % 8 == 0
        return True

    def forward(self, x: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
        """[M, in] -> [M, out] in `out_dtype` (default: x's dtype)."""
        dtype = out_dtype or x.dtype
        path = self.path(x.shape[0])
        if path == "packed":
            out: Tensor = torch.ops.surge.w8a8_linear(
                x, self.weight, self.scale, self.wsum, self.bias, dtype
            )
            return out
        if path == "gemv":
            return self.gemv(x).to(dtype)
        if path == "w8a8":
            return self.w8a8(x, dtype)
        w = dequantize_int8(self.weight, self.scale, x.dtype)
        return F.linear(x, w, self._bias(x)).to(dtype)

    def gemv(self, x: Tensor) -> Tensor:
        if self.kernels:
            out: Tensor = torch.ops.surge.int8_gemv(x, self.weight, self.scale, self.bias)
            return out
        # int8 -> x.dtype cast of the weight costs one pass over it: fine for the fallback.
        out = F.linear(x, self.weight.to(x.dtype)) * self.scale.to(x.dtype)
        return out if self.bias is None else out + self.bias.to(x.dtype)

    def w8a8(self, x: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
        dtype = out_dtype or x.dtype
        # Traced by torch.compile, the torch-ops spelling is better: inductor fuses the
        # quantization into the kernel that made x (a norm, SiLU) and the epilogue into the one
        # that uses the output, where the compiled ops would be two passes of their own.
        if self.kernels and not torch.compiler.is_compiling():
            xq, sx, zx = torch.ops.surge.quantize_rows(x)
            acc = torch._int_mm(xq, self.weight.t())
            out: Tensor = torch.ops.surge.dequantize_int32(
                acc, sx, zx, self.scale, self.wsum, self.bias, dtype
            )
            return out
        xq, sx, zx = quantize_rows_ref(x)
        acc = torch._int_mm(xq, self.weight.t())  # [M, N] int32
        acc = acc - zx[:, None] * self.wsum
        y = acc.float() * sx[:, None] * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype)

    def _bias(self, x: Tensor) -> Tensor | None:
        return None if self.bias is None else self.bias.to(x.dtype)


class Int8Embedding(nn.Module):
    """Token embedding stored as int8 rows with per-row scales (or as 4-bit blocks, a Q4Linear
    head, where the file stores it in Q4_0/Q4_1); a lookup dequantizes its rows.

    With tied embeddings the same matrix is the LM head: row v of the embedding is output
    channel v of the head, so one per-row scale serves both and the weights are stored once.
    """

    def __init__(self, head: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.head = head  # its weight and scale are the embedding's rows and row scales
        self.dtype = dtype

    @classmethod
    def from_float(
        cls, embedding: nn.Embedding, dtype: torch.dtype, mode: str, kernels: bool
    ) -> Int8Embedding:
        q, scale = quantize_int8(embedding.weight.detach())
        return cls(Int8Linear(q, scale, None, mode, kernels), dtype)

    def forward(self, ids: Tensor) -> Tensor:  # [num_tokens] -> [num_tokens, hidden]
        head = cast(_RowLookup, self.head)  # Int8Linear or Q4Linear: float32 rows
        return head.lookup(ids).to(self.dtype)


class _RowLookup(Protocol):
    def lookup(self, ids: Tensor) -> Tensor: ...


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the state dict (weights, scales; not the rotary tables), shared tensors once."""
    seen: set[int] = set()
    total = 0
    for t in model.state_dict(keep_vars=True).values():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total
