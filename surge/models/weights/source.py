"""A weight matrix read in row chunks, never whole in float32 unless asked: what the streaming
build (surge/models/stream_load.py) turns into each layer's final form one tensor at a time.

    FloatMatrix    a float tensor already in memory (safetensors, a GGUF's F32/F16 rows)
    GGUFMatrix     a GGUF tensor's rows of blocks in the memory-mapped file, optionally with
                   its rows permuted (llama.cpp's q/k RoPE order undone by index)
    StackedMatrix  matrices stacked along the rows (fused q/k/v, gate/up)

`rows(a, b)` gives float32 rows a..b; `blocks(a, b)` the raw GGML blocks of those rows (uint8
[b - a, row_bytes]) for block types, so a form that keeps the file's blocks (q4 from Q4_0/Q4_1)
never goes through floats. `kind` is the GGML type name ("Q4_0", "F16"...), or "float" for a
tensor in memory, or "mixed" for a stack of different kinds.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass

import gguf
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import Tensor

from surge.models.weights.gguf_blocks import dequantize_blocks

# Values converted per step: bounds a chunk's transients (float32 rows and the conversion's
# temporaries, a few times 8 MiB), where a 128k-vocabulary head in float32 would be 2 GiB.
CHUNK_VALUES = 1 << 21


class MatrixSource:
    """[n, k] float values, read in row ranges."""

    n: int
    k: int
    kind: str

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    def rows(self, a: int, b: int) -> Tensor:
        raise NotImplementedError

    def blocks(self, a: int, b: int) -> Tensor:
        """Raw GGML blocks of rows a..b (uint8 [b - a, row_bytes]); block kinds only."""
        raise TypeError(f"a {self.kind} matrix has no GGML blocks")

    def chunks(self) -> Sequence[tuple[int, int]]:
        size = max(16, CHUNK_VALUES // max(1, self.k))
        return [(a, min(a + size, self.n)) for a in range(0, self.n, size)]

    def dense(self) -> Tensor:
        """The whole matrix in float32 (one tensor in flight)."""
        return self.rows(0, self.n)


@dataclass
class FloatMatrix(MatrixSource):
    tensor: Tensor  # [n, k], any float dtype

    def __post_init__(self) -> None:
        self.n, self.k = (int(d) for d in self.tensor.shape)
        self.kind = "float"

    def rows(self, a: int, b: int) -> Tensor:
        return self.tensor[a:b].float()


class GGUFMatrix(MatrixSource):
    """A 2-D GGUF tensor; `order`: which file row is each of this matrix's rows (None: same)."""

    def __init__(self, tensor: gguf.ReaderTensor, order: np.ndarray | None = None) -> None:
        self.k, self.n = (int(d) for d in tensor.shape.tolist())  # GGUF lists dims innermost first
        self.type = GGMLQuantizationType(tensor.tensor_type)
        self.kind = self.type.name
        block, size = GGML_QUANT_SIZES[self.type]
        self.row_bytes = self.k // block * size
        # [n, row_bytes] uint8 for block types; [n, k] float16/float32 for plain ones.
        self.data = np.asarray(tensor.data).reshape(self.n, -1)
        self.mapped = tensor.data  # the np.memmap view, which knows its mmap (release())
        self.order = order

    def _raw(self, a: int, b: int) -> np.ndarray:
        if self.order is None:
            return np.array(self.data[a:b], copy=True)  # out of the read-only map
        return self.data[self.order[a:b]]  # a gather: a copy already

    def rows(self, a: int, b: int) -> Tensor:
        raw = self._raw(a, b)
        if raw.dtype in (np.float32, np.float16):
            return torch.from_numpy(raw).float()
        fast = dequantize_blocks(raw, self.type)
        if fast is not None:
            return fast.reshape(b - a, self.k)
        if _compiled_dequantize(int(self.type)):
            # The K-quants in C++, bit-exact with gguf.quants (tests/models/test_gguf_blocks.py):
            # gguf's numpy loop took ~8 s of a 1B's Q6_K embedding on 2 cores.
            out: Tensor = torch.ops.surge.gguf_dequantize(torch.from_numpy(raw), int(self.type))
            return out
        values = gguf.quants.dequantize(raw, self.type)
        array = np.require(values, dtype=np.float32, requirements=["C", "W"])
        return torch.from_numpy(array).reshape(b - a, self.k)

    def blocks(self, a: int, b: int) -> Tensor:
        raw = self._raw(a, b)
        if raw.dtype != np.uint8:
            raise TypeError(f"a {self.kind} matrix has no GGML blocks")
        return torch.from_numpy(raw)

    @property
    def nbytes(self) -> int:
        return self.n * self.row_bytes

    def release(self) -> None:
        """Unmap this tensor's pages from the process (MADV_DONTNEED on a read-only file map:
        they stay in the page cache, and a later read faults them back in)."""
        _release(self.mapped)


_PAGE = mmap.PAGESIZE


def _compiled_dequantize(qtype: int) -> bool:
    """The compiled gguf_dequantize serves this GGML type here (the kernel built and loaded)."""
    from surge.models.kernels import GGUF_BLOCKS, load_gguf_blocks

    return qtype in GGUF_BLOCKS and load_gguf_blocks() is not None


def _release(array: np.ndarray) -> None:
    mapping = getattr(array, "_mmap", None)
    if mapping is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    base = np.asarray(np.frombuffer(mapping, dtype=np.uint8)).ctypes.data
    start = array.ctypes.data - base
    end = start + array.nbytes
    start -= start % _PAGE  # whole pages inside the tensor's bytes only would miss its edges;
    end = min(-(-end // _PAGE) * _PAGE, len(mapping))  # the neighbours' pages fault back in
    if end > start:
        mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


class StackedMatrix(MatrixSource):
    """Members stacked along the rows, as the fused projections hold them."""

    def __init__(self, members: Sequence[MatrixSource]) -> None:
        ks = {m.k for m in members}
        if len(ks) != 1:
            raise ValueError(f"cannot stack matrices of widths {sorted(ks)}")
        self.members = list(members)
        self.k = ks.pop()
        self.n = sum(m.n for m in members)
        kinds = {m.kind for m in members}
        self.kind = kinds.pop() if len(kinds) == 1 else "mixed"
        self.kinds = tuple(m.kind for m in members)

    def _parts(self, a: int, b: int) -> list[tuple[MatrixSource, int, int]]:
        out, start = [], 0
        for m in self.members:
            lo, hi = max(a, start), min(b, start + m.n)
            if lo < hi:
                out.append((m, lo - start, hi - start))
            start += m.n
        return out

    def rows(self, a: int, b: int) -> Tensor:
        return torch.cat([m.rows(lo, hi) for m, lo, hi in self._parts(a, b)])

    def blocks(self, a: int, b: int) -> Tensor:
        return torch.cat([m.blocks(lo, hi) for m, lo, hi in self._parts(a, b)])

    def chunks(self) -> Sequence[tuple[int, int]]:
        # Chunks that never straddle two members: each is one member's rows.
        out, start = [], 0
        for m in self.members:
            out += [(start + a, start + b) for a, b in m.chunks()]
            start += m.n
        return out


def as_source(value: Tensor | MatrixSource) -> MatrixSource:
    return value if isinstance(value, MatrixSource) else FloatMatrix(value)
