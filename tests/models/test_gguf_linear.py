"""GGUF's own blocks run as stored (kernels/gguf_blocks.cpp, surge/models/gguf_linear.py):
dequantization bit for bit the gguf package's, for every format, compiled and in torch; the
GEMM against the float matmul of the dequantized weights, for 1 to 300 rows, odd output
widths, bias, bfloat16 and float16 activations; and GGUFLinear's paths and checks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from surge.models.gguf_linear import GGML_TYPES, GGUFLinear, dequantize_blocks, row_bytes
from surge.models.kernels import GGUF_BLOCKS, load_gguf_blocks

needs_kernel = pytest.mark.skipif(load_gguf_blocks() is None, reason="no C++ toolchain here")
TYPES = list(GGML_TYPES)
F16_AT = {2: [0], 3: [0, 2], 8: [0], 12: [0, 2], 13: [0, 2], 14: [208]}  # float16 offsets


def random_blocks(qtype: int, n: int, k: int, seed: int = 0, scale: float = 0.01) -> np.ndarray:
    """Random valid blocks: every byte value in the quants and integer scales, finite float16
    scales of both signs, some of them odd (subnormal, zero, large)."""
    rng = np.random.default_rng(seed)
    weights, size = GGUF_BLOCKS[qtype]
    raw = rng.integers(0, 256, size=(n, k // weights, size), dtype=np.uint8)
    for at in F16_AT[qtype]:
        s = rng.standard_normal((n, k // weights)) * scale
        odd = rng.random(s.shape)
        s = np.where(odd < 0.05, 3e-6, s)  # subnormal in float16
        s = np.where((odd >= 0.05) & (odd < 0.08), 0.0, s)
        s = np.where((odd >= 0.08) & (odd < 0.1), -40 * scale, s)
        raw[..., at : at + 2] = s.astype(np.float16).view(np.uint8).reshape(*s.shape, 2)
    return raw.reshape(n, -1)


def gguf_dequantize(raw: np.ndarray, qtype: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).astype(np.float32)


def bits(a: np.ndarray | torch.Tensor) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_is_gguf_bit_for_bit(name: str) -> None:
    qtype = GGML_TYPES[name]
    raw = random_blocks(qtype, 37, 768 if GGUF_BLOCKS[qtype][0] == 256 else 96, seed=qtype)
    want = gguf_dequantize(raw, qtype)
    assert np.array_equal(bits(dequantize_blocks(torch.from_numpy(raw), qtype)), bits(want))
    if load_gguf_blocks() is not None:
        got = torch.ops.surge.gguf_dequantize(torch.from_numpy(raw), qtype)
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert np.array_equal(bits(got), bits(want))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
def test_dequantize_blocks_that_gguf_quantized(name: str) -> None:
    """The formats gguf.quants can write: its own blocks of real-looking weights."""
    qtype = GGML_TYPES[name]
    w = np.random.default_rng(1).standard_normal((24, 256)).astype(np.float32) * 0.05
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
    want = gguf_dequantize(raw, qtype)
    assert np.abs(want - w).max() < 0.05  # real blocks, not noise
    assert np.array_equal(bits(dequantize_blocks(torch.from_numpy(raw), qtype)), bits(want))
    if load_gguf_blocks() is not None:
        got = torch.ops.surge.gguf_dequantize(torch.from_numpy(raw), qtype)
        assert np.array_equal(bits(got), bits(want))


def test_products_are_exact_so_fusing_cannot_change_the_bits() -> None:
    """Why -ffast-math (which may fuse a * q - b into one FMA, or regroup d * sc * q) cannot
    move a bit: a float16 scale (11 significant bits) times a 6-bit integer scale times a
    6-bit q needs at most 24 bits, so every product is exact in float32 and the one rounding
    is the offset's subtraction, fused or not. Checked on Q4_K/Q5_K blocks: one rounding of the
    exact a * q - b is gguf's value. (The kernel pins the products anyway: SURGE_KEEP.)"""
    for qtype, qs_at, high in ((12, 16, False), (13, 48, True)):
        block = random_blocks(qtype, 64, 256, seed=qtype).reshape(64, -1)
        d = block[:, 0:2].copy().view(np.float16).astype(np.float64)
        dmin = block[:, 2:4].copy().view(np.float16).astype(np.float64)
        sc = (block[:, 4:5] & 63).astype(np.float64)  # sub-block 0's scale and min
        mn = (block[:, 8:9] & 63).astype(np.float64)
        q = (block[:, qs_at : qs_at + 32] & 0x0F).astype(np.float64)
        if high:
            q += (block[:, 16:48] & 1) * 16
        a, b = d * sc, dmin * mn
        assert np.array_equal(a.astype(np.float32), a) and np.array_equal(
            (a * q).astype(np.float32), a * q
        )
        fused = (a * q - b).astype(np.float32)  # exact, then one rounding
        want = gguf_dequantize(block, qtype)[:, :32]
        assert np.array_equal(bits(fused), bits(want))


def rounded_per_block(x: torch.Tensor) -> torch.Tensor:
    """The activations as the kernel rounds them: int8 per block of 32, scale amax / 127."""
    rows, k = x.shape
    xb = x.float().reshape(rows, k // 32, 32)
    dx = xb.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.where(dx > 0, torch.round(xb / dx.clamp(min=1e-30)), 0.0)
    return (q * dx).reshape(rows, k)


def layer(name: str, n: int = 67, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Blocks of an [n, k] weight (n = 67: 8 tiles of 8 output rows and 3 left over) and the
    weights they hold."""
    qtype = GGML_TYPES[name]
    k = 768 if GGUF_BLOCKS[qtype][0] == 256 else 288
    raw = random_blocks(qtype, n, k, seed=seed)
    return torch.from_numpy(raw), torch.from_numpy(gguf_dequantize(raw, qtype)), qtype


def check_close(
    got: torch.Tensor, x_used: torch.Tensor, wd: torch.Tensor, bias: torch.Tensor | None
) -> None:
    """got == x_used @ wd.T + bias up to float32 summation order: the bound scales with the
    sum of the terms' magnitudes."""
    want = x_used @ wd.t() + (0 if bias is None else bias)
    bound = 1e-5 * (x_used.abs() @ wd.abs().t()) + 1e-6
    assert ((got.float() - want).abs() <= bound).all(), (got.float() - want).abs().max()


@needs_kernel
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("rows", [1, 4, 17, 64, 300])
def test_gemm_is_the_file_weights_times_the_rounded_activations(name: str, rows: int) -> None:
    """rows: one pass of up to 4 rows, passes with rows left over, and (300) several blocks of
    rows; 67 output rows split between threads with rows after the last tile."""
    blocks, wd, qtype = layer(name)
    torch.manual_seed(rows)
    x = torch.randn(rows, wd.shape[1])
    x[0, :64] = 0.0  # all-zero blocks: zero scales
    bias = torch.randn(wd.shape[0])
    for b in (None, bias):
        got = torch.ops.surge.gguf_linear(x, blocks, qtype, b)
        assert got.shape == (rows, wd.shape[0]) and got.dtype == torch.float32
        check_close(got, rounded_per_block(x), wd, b)
    # Against the unrounded activations: the error int8 rounding of x costs.
    exact = x @ wd.t()
    assert ((got - bias - exact).norm() / exact.norm()).item() < 0.02


@needs_kernel
@pytest.mark.parametrize("name", TYPES)
def test_gemm_of_half_precision_activations(name: str) -> None:
    blocks, wd, qtype = layer(name, n=21)
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(5, wd.shape[1]).to(dtype)
        got = torch.ops.surge.gguf_linear(x, blocks, qtype, None)
        assert got.dtype == dtype
        want = rounded_per_block(x.float()) @ wd.t()
        torch.testing.assert_close(
            got.float(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item()
        )


@needs_kernel
def test_gemm_of_a_zero_row_is_the_bias() -> None:
    blocks, wd, qtype = layer("Q4_K", n=16)
    bias = torch.randn(16)
    got = torch.ops.surge.gguf_linear(torch.zeros(3, wd.shape[1]), blocks, qtype, bias)
    assert torch.equal(got, bias.expand(3, 16))


@needs_kernel
def test_kernel_refuses_bad_shapes() -> None:
    blocks, _, qtype = layer("Q4_K", n=16)
    with pytest.raises(RuntimeError, match="x must be"):
        torch.ops.surge.gguf_linear(torch.randn(2, 512), blocks, qtype, None)
    with pytest.raises(RuntimeError, match="not a whole number"):
        torch.ops.surge.gguf_dequantize(blocks[:, :100].contiguous(), qtype)
    with pytest.raises(RuntimeError, match="not supported"):
        torch.ops.surge.gguf_dequantize(blocks, 1)


@pytest.mark.parametrize("name", TYPES)
def test_gguf_linear_module(name: str) -> None:
    """The kernel path (where built) and the torch fallback: the same layer, the same values."""
    blocks, wd, qtype = layer(name, n=40, seed=3)
    bias = torch.randn(40)
    fallback = GGUFLinear(blocks, qtype, 40, wd.shape[1], bias, kernels=False)
    assert torch.equal(fallback.dequantize(), wd)
    x = torch.randn(2, 3, wd.shape[1])
    y = fallback(x)
    assert y.shape == (2, 3, 40)
    torch.testing.assert_close(y, x @ wd.t() + bias, rtol=1e-4, atol=1e-4)
    assert fallback(x.bfloat16(), out_dtype=torch.float32).dtype == torch.float32
    if load_gguf_blocks() is None:
        return
    fast = GGUFLinear(blocks, qtype, 40, wd.shape[1], bias)
    assert fast.kernels and fast.blocks.data_ptr() == blocks.data_ptr()  # the blocks, no copy
    assert torch.equal(fast.dequantize(), wd)
    check_close(fast(x).reshape(6, 40), rounded_per_block(x.reshape(6, -1)), wd, bias)
    assert fast(x.bfloat16()).dtype == torch.bfloat16
    assert fast(x, out_dtype=torch.bfloat16).dtype == torch.bfloat16


def test_gguf_linear_refuses_blocks_of_another_shape() -> None:
    with pytest.raises(ValueError, match="must be uint8"):
        GGUFLinear(torch.zeros(4, 144, dtype=torch.uint8), GGML_TYPES["Q4_K"], 4, 512)
    with pytest.raises(ValueError, match="divisible by 256"):
        row_bytes(GGML_TYPES["Q6_K"], 300)
    with pytest.raises(ValueError, match="GGML type 1 "):
        row_bytes(1, 256)  # F16: not a block format served here
    assert row_bytes(GGML_TYPES["Q4_0"], 64) == 36
