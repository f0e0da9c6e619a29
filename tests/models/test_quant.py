"""int8 linear layers: quantize/dequantize round trip, and every kernel path against a float
reference built from the dequantized weights, for each row count that selects a path."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from surge.models.kernels import load_int8_linear, load_w8a8_linear
from surge.models.quant import (
    GEMV_MAX_ROWS,
    INT8_MODES,
    NO_VNNI_GEMV_MAX_ROWS,
    Int8Embedding,
    Int8Linear,
    cpu_int8_fast,
    dequantize_int8,
    pack_int8,
    quantize_int8,
    quantize_rows_ref,
    unpack_int8,
    weight_bytes,
)


def _kernels() -> bool:
    return load_int8_linear() is not None


def test_quantize_round_trip() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 70, generator=gen) * torch.rand(48, 1, generator=gen)  # varied row scales
    w[5] = 0.0  # an all-zero row must not divide by zero
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (48,)
    assert q.abs().max().item() <= 127
    back = dequantize_int8(q, scale)
    # Round to nearest: every element within half a step of its row's scale.
    assert ((back - w).abs() <= scale[:, None] / 2 + 1e-7).all()
    assert (back[5] == 0).all()
    # Quantizing the dequantized weights again is exact.
    q2, scale2 = quantize_int8(back)
    assert torch.equal(q2, q) and torch.allclose(scale2, scale)


def _reference(layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
    w = dequantize_int8(layer.dense_weight(), layer.scale)
    bias = layer.bias
    return x.float() @ w.t() + (0 if bias is None else bias)


# Shapes from SmolLM2 (qkv, down) plus one whose K is not a multiple of the kernel's 64-step.
SHAPES = [(576, 960), (1536, 576), (100, 40)]
ROWS = [1, 3, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 64]


@pytest.mark.parametrize("use_kernels", [True, False])
@pytest.mark.parametrize("mode", ["int8", "int8-weight-only", "w8a8"])
@pytest.mark.parametrize(("k", "n"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_matches_dequantized_reference(
    use_kernels: bool, mode: str, k: int, n: int, dtype: torch.dtype
) -> None:
    if use_kernels and not _kernels():
        pytest.skip("no C++ toolchain: the torch path is the only one")
    gen = torch.Generator().manual_seed(k + n)
    linear = nn.Linear(k, n, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        linear.bias.copy_(torch.randn(n, generator=gen) * 0.1)
    layer = Int8Linear.from_float(linear, mode, use_kernels)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=gen).to(dtype)
        got = layer(x)
        assert got.shape == (rows, n) and got.dtype == dtype
        ref = _reference(layer, x)
        path = layer.path(rows)
        # gemv rounds activations to 16 bits, w8a8 to 8 bits (per row); bf16 output rounding.
        rel = {"gemv": 1e-3, "dequant": 1e-3, "w8a8": 2.5e-2, "packed": 2.5e-2}[path]
        if dtype == torch.bfloat16:
            rel = max(rel, 1e-2)
        err = (got.float() - ref).abs().max().item() / ref.abs().max().item()
        assert err < rel, f"{mode} {path} rows={rows} k={k}: {err:.2e}"


def test_paths_per_rows() -> None:
    layer = Int8Linear(torch.zeros(8, 16, dtype=torch.int8), torch.ones(8))
    only = Int8Linear(torch.zeros(8, 16, dtype=torch.int8), torch.ones(8), mode="int8-weight-only")
    w8a8 = Int8Linear(torch.zeros(8, 16, dtype=torch.int8), torch.ones(8), mode="w8a8")
    assert layer.path(1) == "gemv" and layer.path(GEMV_MAX_ROWS) == "gemv"
    assert only.path(1) == "gemv" and only.path(NO_VNNI_GEMV_MAX_ROWS + 1) == "dequant"
    if not cpu_int8_fast():
        # torch._int_mm is a slow generic loop without VNNI/AMX: never taken; the compiled
        # GEMV (kernels) serves up to NO_VNNI_GEMV_MAX_ROWS rows, the torch fallback up to 8.
        for mode in INT8_MODES:
            q, scale = torch.zeros(8, 16, dtype=torch.int8), torch.ones(8)
            fast = Int8Linear(q, scale, None, mode, True)
            slow = Int8Linear(q, scale, None, mode, False)
            assert fast.path(NO_VNNI_GEMV_MAX_ROWS) == "gemv"
            assert fast.path(NO_VNNI_GEMV_MAX_ROWS + 1) == "dequant"
            assert slow.path(GEMV_MAX_ROWS) == "gemv" and slow.path(GEMV_MAX_ROWS + 1) == "dequant"
        return
    assert layer.path(GEMV_MAX_ROWS + 1) == "w8a8"
    assert w8a8.path(1) == "w8a8" and w8a8.path(512) == "w8a8"


def test_quantize_rows_kernel_matches_reference() -> None:
    if not _kernels():
        pytest.skip("no C++ toolchain")
    x = torch.randn(5, 77, generator=torch.Generator().manual_seed(1)).bfloat16()
    x[2] = 0
    x[3] = x[3].abs() + 1  # all positive: the range still includes 0
    q, s, z = torch.ops.surge.quantize_rows(x)
    q_ref, s_ref, z_ref = quantize_rows_ref(x)
    assert torch.allclose(s, s_ref) and torch.equal(z, z_ref)
    assert (q.int() - q_ref.int()).abs().max().item() <= 1  # ties may round either way
    back = s[:, None] * (q.float() - z[:, None])
    assert ((back - x.float()).abs() <= s[:, None] * 0.51).all()
    assert (back[2] == 0).all()


def test_tied_embedding_shares_the_head() -> None:
    gen = torch.Generator().manual_seed(2)
    emb = nn.Embedding(300, 64)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(300, 64, generator=gen))
    qemb = Int8Embedding.from_float(emb, torch.float32, "int8", _kernels())
    ids = torch.tensor([0, 5, 299, 5])
    ref = dequantize_int8(*quantize_int8(emb.weight.detach()))
    assert torch.allclose(qemb(ids), ref[ids], atol=1e-6)
    x = torch.randn(2, 64, generator=gen)
    logits = qemb.head(x)
    # Packed, the head quantizes its activations to 8 bits per row (W8A8); else a 16-bit GEMV.
    tol = 2.5e-2 if qemb.head.packed else 1e-3
    assert torch.allclose(logits, x @ ref.t(), rtol=tol, atol=tol * logits.abs().max().item())
    # One int8 matrix serves both: 1 byte per weight, a scale and a row sum (8 bytes) per row;
    # packed for the GEMM, the rows are padded to a multiple of 16.
    rows = 304 if qemb.head.packed else 300
    assert weight_bytes(qemb) == rows * 64 + 300 * 8


def test_pack_int8_round_trip() -> None:
    q = torch.randint(
        -127, 128, (37, 70), dtype=torch.int8, generator=torch.Generator().manual_seed(3)
    )
    packed = pack_int8(q)
    assert packed.shape == (3, 18, 16, 4)  # 37 rows -> 48, 70 columns -> 72
    assert torch.equal(unpack_int8(packed, 37, 70), q)
    # One 64-byte line: 16 output channels x 4 consecutive inputs.
    assert torch.equal(packed[1, 2], q[16:32, 8:12])
    assert (packed[2, :, 5:] == 0).all() and (packed[:, 17, :, 2:] == 0).all()


@pytest.mark.parametrize(
    ("m", "k", "n"), [(1, 576, 960), (5, 40, 37), (13, 1536, 576), (64, 576, 3072), (3, 7, 200)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_gemm_equals_int_mm_path(m: int, k: int, n: int, dtype: torch.dtype) -> None:
    """The packed GEMM computes quantize_rows + torch._int_mm + dequantize_int32's sums exactly
    (its zero point is theirs + 128), for every tile shape and channel tail."""
    if not _kernels() or not hasattr(torch.ops.surge, "w8a8_linear"):
        pytest.skip("no C++ toolchain")
    gen = torch.Generator().manual_seed(m * k + n)
    q, scale = quantize_int8(torch.randn(n, k, generator=gen))
    wsum = q.sum(dim=1, dtype=torch.int32)
    bias = torch.randn(n, generator=gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    x[0, : k // 2] = x[0, : k // 2].abs()  # a skewed row: its zero point is far from 128
    got = torch.ops.surge.w8a8_linear(x, pack_int8(q), scale, wsum, bias, None)
    assert got.dtype == dtype and got.shape == (m, n)
    xq, sx, zx = torch.ops.surge.quantize_rows(x)
    acc = torch._int_mm(xq, q.t()) if m > 16 else (xq.int() @ q.int().t())
    ref = torch.ops.surge.dequantize_int32(acc.int(), sx, zx, scale, wsum, bias, dtype)
    assert torch.equal(got, ref)
    as_float = torch.ops.surge.w8a8_linear(x, pack_int8(q), scale, wsum, None, torch.float32)
    assert as_float.dtype == torch.float32
    assert torch.allclose(
        as_float + bias, ref.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-2
    )


def test_packed_layer_serves_every_row_count() -> None:
    module = load_w8a8_linear()
    if not _kernels() or module is None or not module.supported:
        pytest.skip("no C++ toolchain or no AVX-512 VNNI: the row-major paths run")
    layer = Int8Linear(torch.zeros(16, 64, dtype=torch.int8), torch.ones(16), kernels=True)
    assert layer.packed and layer.path(1) == "packed" and layer.path(512) == "packed"
    only = Int8Linear(
        torch.zeros(16, 64, dtype=torch.int8), torch.ones(16), mode="int8-weight-only", kernels=True
    )
    assert not only.packed and only.path(1) == "gemv"
