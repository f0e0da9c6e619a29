"""A GGUF file's metadata and tensor table, read fast.

gguf-py's GGUFReader makes a numpy view for every element of every array in the metadata: ~13 s
for Gemma 3's 262,144-token vocabulary (three such arrays), paid by the API and the engine process
alike. This reads the same format (little-endian GGUF v2/v3) with `struct` and one `frombuffer`
per numeric array, and yields gguf-py's own ReaderTensor records (memory-mapped data, shaped as
gguf-py shapes them, for gguf.quants.dequantize)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import quant_shape_to_byte_shape

_MAGIC = b"GGUF"
# GGUF value types: struct format of the scalars, numpy dtype of arrays of them.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_PLAIN_DTYPES = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class _Field:
    """What GGUFReader.get_field returns, as far as Surge uses it: contents()."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def contents(self) -> Any:
        return self._value


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._data = np.memmap(self.path, mode="r")
        self._buf = self._data.data  # a memoryview, which struct reads
        buf = self._data
        if bytes(buf[:4]) != _MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", self._buf, 4)
        if version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {version} is not supported")
        self._offset = 24
        self.fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            (kind,) = self._unpack("<I")
            self.fields[key] = self._value(kind)
        infos = [self._tensor_info() for _ in range(n_tensors)]
        alignment = int(self.fields.get("general.alignment", 32))
        start = -(-self._offset // alignment) * alignment
        self.tensors = [self._tensor(start, *info) for info in infos]

    def get_field(self, name: str) -> _Field | None:
        return _Field(self.fields[name]) if name in self.fields else None

    # -- parsing --------------------------------------------------------------------------------

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self._buf, self._offset)
        self._offset += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        text = bytes(self._buf[self._offset : self._offset + n]).decode("utf-8", "replace")
        self._offset += n
        return text

    def _strings(self, n: int) -> list[str]:
        """An array of `n` strings (a vocabulary, its merges): one tight loop over the buffer's
        memoryview (a numpy slice a string cost ~25 us: 4 s of a 128k vocabulary's open)."""
        buf, off, out = self._buf, self._offset, []
        length_at = struct.Struct("<Q").unpack_from
        for _ in range(n):
            (length,) = length_at(buf, off)
            off += 8
            out.append(str(buf[off : off + length], "utf-8", "replace"))
            off += length
        self._offset = off
        return out

    def _value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self._unpack("<" + _SCALARS[kind])[0]
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise ValueError(f"{self.path}: unknown GGUF value type {kind}")
        item, n = self._unpack("<IQ")
        if item in _SCALARS:
            dtype = np.dtype("<" + _SCALARS[item])
            values = np.frombuffer(self._data, dtype, n, self._offset)
            self._offset += n * dtype.itemsize
            return values.tolist()
        if item == _STRING:
            return self._strings(n)
        return [self._value(item) for _ in range(n)]

    def _tensor_info(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string()
        (n_dims,) = self._unpack("<I")
        dims = self._unpack(f"<{n_dims}Q")
        kind, offset = self._unpack("<IQ")
        return name, dims, kind, offset

    def _tensor(self, start: int, name: str, dims: tuple[int, ...], kind: int, offset: int) -> Any:
        ggml_type = GGMLQuantizationType(kind)
        n_elems = int(np.prod(dims))
        block_size, type_size = GGML_QUANT_SIZES[ggml_type]
        n_bytes = n_elems * type_size // block_size
        np_dims = tuple(reversed(dims))
        dtype = _PLAIN_DTYPES.get(ggml_type)
        begin = start + offset
        if dtype is None:
            data = self._data[begin : begin + n_bytes]
            np_dims = quant_shape_to_byte_shape(np_dims, ggml_type)
        else:
            data = self._data[begin : begin + n_bytes].view(dtype)
        return ReaderTensor(
            name=name,
            tensor_type=ggml_type,
            shape=np.array(dims, dtype=np.uint64),
            n_elements=n_elems,
            n_bytes=n_bytes,
            data_offset=begin,
            data=data.reshape(np_dims),
            field=None,  # type: ignore[arg-type]
        )


# What Surge's readers of GGUF metadata take: this file, or gguf-py's reader of it.
GGUFSource = GGUFFile | GGUFReader
