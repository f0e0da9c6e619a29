"""The torch dequantization of GGUF's simple block formats is gguf's own, bit for bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from surge.models.weights.gguf_blocks import dequantize_blocks

Q = gguf.GGMLQuantizationType
# block bytes, how many leading float16 fields (the scale, and Q4_1's min)
FORMATS = {Q.Q4_0: (18, 1), Q.Q4_1: (20, 2), Q.Q8_0: (34, 1)}


@pytest.mark.parametrize("kind", list(FORMATS), ids=lambda k: k.name)
def test_blocks_dequantize_as_gguf_does(kind: Q) -> None:
    size, halves = FORMATS[kind]
    rng = np.random.default_rng(int(kind))
    raw = rng.integers(0, 256, (8 * 48, size), dtype=np.uint8)  # every nibble and byte value
    scales = (rng.standard_normal((len(raw), halves)) * 0.1).astype(np.float16)
    raw[:, : 2 * halves] = scales.view(np.uint8)
    data = raw.reshape(8, -1)  # 8 rows of 48 blocks, as a tensor's data comes
    want = gguf.quants.dequantize(data, kind).reshape(-1)
    got = dequantize_blocks(data, kind)
    assert got is not None and got.dtype == torch.float32
    assert np.array_equal(got.numpy().view(np.uint32), want.astype(np.float32).view(np.uint32))


def test_other_formats_are_left_to_gguf() -> None:
    assert dequantize_blocks(np.zeros((2, 144), dtype=np.uint8), Q.Q4_K) is None
    assert dequantize_blocks(np.zeros((2, 8), dtype=np.uint8), Q.F16) is None
