"""4-bit block weights: the packing, exact recovery of a Q4_1 GGUF file's own blocks, the compiled
kernel against its definition, and which path a Q4Linear takes per batch size."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from surge.models.kernels import load_int8_linear, load_q4_linear
from surge.models.q4 import Q4Linear, _pack, _unpack, dequantize_q4, quantize_q4
from surge.models.quant import GEMV_MAX_ROWS, NO_VNNI_GEMV_MAX_ROWS, cpu_int8_fast
from surge.models.weights.gguf import dequantize

needs_kernel = pytest.mark.skipif(
    load_q4_linear() is None or load_int8_linear() is None, reason="no C++ toolchain here"
)


@pytest.mark.parametrize("k", [64, 576, 1024, 1536])
def test_packing_inverts_and_requantizing_is_exact(k: int) -> None:
    """K = 576 is one interleaved group of 16 blocks and one pair; 1024 two groups; 64 a pair."""
    torch.manual_seed(0)
    q = torch.randint(0, 16, (5, k), dtype=torch.uint8)
    assert torch.equal(_unpack(_pack(q)), q)
    w = torch.randn(7, k) * 0.05
    qs, dm = quantize_q4(w)
    assert qs.shape == (7, k // 2) and qs.dtype == torch.uint8
    assert dm.shape == (7, 2, k // 32) and dm.dtype == torch.float16
    back = dequantize_q4(qs, dm)
    step = dm[:, 0].float().repeat_interleave(32, dim=1)
    assert ((back - w).abs() <= step / 2 + 1e-4).all()  # nearest of 16 levels
    assert torch.equal(back, dequantize_q4(*quantize_q4(back)))  # a second pass changes nothing


def test_constant_block_and_bad_width() -> None:
    w = torch.full((2, 64), 0.25)
    qs, dm = quantize_q4(w)
    assert torch.equal(dequantize_q4(qs, dm), w)  # d = 0, m = the value
    with pytest.raises(ValueError, match="divisible by 64"):
        quantize_q4(torch.randn(4, 96))


def test_recovers_the_gguf_files_own_q4_1_blocks(smollm2_gguf_path: Path) -> None:
    """From the dequantized file, quantize_q4 finds the very d, m and q the file stores: the
    model runs on the shipped weights, with no second rounding."""
    reader = gguf.GGUFReader(smollm2_gguf_path)
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    assert tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1
    w = dequantize(tensor)  # [576, 1536]
    rows, k = w.shape
    blocks = np.asarray(tensor.data).reshape(rows, k // 32, 20)  # f16 d, f16 m, 16 bytes
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    nibbles = blocks[..., 4:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(rows, k)
    qs, dm = quantize_q4(w)
    assert np.array_equal(dm[:, 0].numpy(), d) and np.array_equal(dm[:, 1].numpy(), m)
    assert np.array_equal(_unpack(qs).numpy(), q)


def _rounded_per_block(x: torch.Tensor) -> torch.Tensor:
    """The activations as the kernel rounds them: int8 per block of 32, scale amax / 127."""
    rows, k = x.shape
    xb = x.float().reshape(rows, k // 32, 32)
    dx = xb.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.where(dx > 0, torch.round(xb / dx.clamp(min=1e-30)), 0.0)
    return (q * dx).reshape(rows, k)


@needs_kernel
@pytest.mark.parametrize("k", [64, 576, 1536])
@pytest.mark.parametrize("n", [70, 300])
def test_kernel_is_the_file_weights_times_the_rounded_activations(k: int, n: int) -> None:
    """n = 70: four tiles of 16 output channels and 6 left over, one thread; 300: 18 tiles
    split between threads, the last range also taking the 12 left over."""
    torch.manual_seed(1)
    w, bias = torch.randn(n, k) * 0.05, torch.randn(n)
    qs, dm = quantize_q4(w)
    wd = dequantize_q4(qs, dm)
    for rows in (1, 3, 8, 9, 17):  # 8 rows share a pass over the weights; 9 and 17 spill over
        x = torch.randn(rows, k)
        x[0] = 0.0  # an all-zero row: zero scales, bias only
        want = _rounded_per_block(x) @ wd.t() + bias
        got = torch.ops.surge.q4_gemv(x, qs, dm, bias)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-3)
        assert torch.equal(got[0], bias)
        # Against the unrounded activations: the error int8 rounding of x costs.
        if rows > 1:
            exact = x[1:] @ wd.t()
            assert ((got[1:] - bias - exact).norm() / exact.norm()).item() < 0.01
    xb = torch.randn(4, k).bfloat16()
    got_bf16 = torch.ops.surge.q4_gemv(xb, qs, dm, None)
    assert got_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(
        got_bf16.float(), _rounded_per_block(xb) @ wd.t(), rtol=2e-2, atol=2e-2
    )


@needs_kernel
def test_q4_linear_takes_the_4_bit_kernel_at_every_batch_size() -> None:
    """No int8 copy by default: the 4-bit kernel serves 1 row and 600 alike (q4_gemv goes 8
    rows a pass, so large batches are its loop, checked against dequantized weights)."""
    torch.manual_seed(2)
    linear = torch.nn.Linear(128, 48, bias=True)
    layer = Q4Linear.from_float(linear, kernels=True)
    assert layer.int8 is None
    for rows in (1, GEMV_MAX_ROWS, 64, 600):
        x = torch.randn(rows, 128)
        want = torch.ops.surge.q4_gemv(x, layer.qs, layer.dm, layer.bias)
        assert torch.equal(layer(x), want)
        ref = _rounded_per_block(x) @ dequantize_q4(layer.qs, layer.dm).t() + layer.bias
        torch.testing.assert_close(layer(x), ref, rtol=1e-4, atol=2e-3)
    # The layer is the linear one, 16 levels per block of uniform weights: ~6% error.
    small = torch.randn(4, 128)
    ref = linear(small).detach()
    assert ((layer(small) - ref).norm() / ref.norm()).item() < 0.1


@needs_kernel
def test_q4_int8_keeps_an_int8_copy_for_large_batches() -> None:
    torch.manual_seed(2)
    linear = torch.nn.Linear(128, 48, bias=True)
    layer = Q4Linear.from_float(linear, kernels=True, int8_copy=True)
    assert layer.int8 is not None
    small = torch.randn(GEMV_MAX_ROWS, 128)
    want = torch.ops.surge.q4_gemv(small, layer.qs, layer.dm, layer.bias)
    assert torch.equal(layer(small), want)
    # Past gemv_max_rows (8; without VNNI, where the 4-bit kernel outruns every int8 path,
    # NO_VNNI_GEMV_MAX_ROWS) the int8 copy.
    assert layer.gemv_max_rows == (GEMV_MAX_ROWS if cpu_int8_fast() else NO_VNNI_GEMV_MAX_ROWS)
    big = torch.randn(layer.gemv_max_rows + 1, 128)
    assert torch.equal(layer(big), layer.int8(big))


def test_q4_linear_without_kernels_dequantizes() -> None:
    torch.manual_seed(3)
    linear = torch.nn.Linear(128, 16, bias=True)
    layer = Q4Linear.from_float(linear, kernels=False)
    x = torch.randn(5, 128)
    want = x @ dequantize_q4(layer.qs, layer.dm).t() + linear.bias.detach()
    torch.testing.assert_close(layer(x), want)
