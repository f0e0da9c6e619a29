"""The compiled paged-decode kernel against the torch-ops path on random blocks and tables, with
float caches and with int8 ones (rows of values and their scales)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from surge.models import kernels
from surge.models.attention import _decode_attention
from surge.models.kernels import _build_tag, load_paged_decode
from surge.models.kv_quant import dequantize_rows, quantize_rows


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)]
)
@pytest.mark.parametrize(
    ("head_dim", "heads", "kv_heads"),
    # 64 and 128 take the AVX-512 kernel where the CPU has it (queries in chunks of 256 / head_dim:
    # groups 1, 3, 8 cover one partial, one exact and several chunks); 32 the portable one.
    # 256 (Gemma 3): the portable one for float caches, the register path for int8 ones.
    [(64, 6, 2), (64, 8, 8), (64, 8, 1), (128, 6, 2), (128, 4, 1), (32, 6, 2), (256, 4, 1)],
)
@pytest.mark.parametrize(
    ("block", "lengths"),
    # Blocks of 4: each key's row looked up on its own, the block size a run-time value; of 16
    # (the engine's, a compile-time constant in the AVX-512 kernel): a tile of 16 keys is one
    # block's rows, and the next tile's are fetched ahead (int8), across 10 blocks.
    [(4, [1, 3, 4, 5, 9, 16, 20, 37]), (16, [1, 15, 16, 17, 33, 48, 100, 160])],
)
def test_kernel_matches_torch_ops(
    dtype: torch.dtype,
    tol: float,
    head_dim: int,
    heads: int,
    kv_heads: int,
    block: int,
    lengths: list[int],
) -> None:
    module = load_paged_decode()
    if module is None:
        pytest.skip("no C++ toolchain: the torch path is the only one")
    gen = torch.Generator().manual_seed(0)
    d, num_blocks = 8, 60
    q = torch.randn(d, heads, head_dim, generator=gen).to(dtype)
    k_cache = torch.randn(kv_heads, num_blocks, block, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(kv_heads, num_blocks, block, head_dim, generator=gen).to(dtype)
    lens = torch.tensor(lengths)  # around and past 16-key tiles
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:10] for _ in range(d)])
    span = torch.arange(tables.shape[1] * block)
    bias = torch.zeros(d, 1, span.numel()).masked_fill_(
        (span.unsqueeze(0) >= lens.unsqueeze(1)).unsqueeze(1), -torch.inf
    )

    class Meta:  # the fields the torch path reads
        decode_block_tables = tables
        decode_bias = bias
        decode_op = None

    ref = _decode_attention(q, k_cache, v_cache, Meta, 0.125, heads // kv_heads)  # type: ignore[arg-type]
    got = torch.ops.surge.paged_decode(q, k_cache, v_cache, tables, lens, 0.125)
    assert got.dtype == dtype
    assert (got.float() - ref.float()).abs().max().item() < tol
    if head_dim == 32 or dtype != torch.float32:
        return
    # The same cache in int8: the kernel reads the rows' values and scales as the torch path
    # dequantizes them, queries and output in float32.
    k8, v8 = quantize_rows(k_cache), quantize_rows(v_cache)
    assert k8.dtype == torch.int8 and k8.shape[-1] == head_dim + 4
    ref8 = _decode_attention(q, k8, v8, Meta, 0.125, heads // kv_heads)  # type: ignore[arg-type]
    got8 = torch.ops.surge.paged_decode(q, k8, v8, tables, lens, 0.125)
    assert got8.dtype == torch.float32
    assert (got8 - ref8).abs().max().item() < 1e-5
    assert (got8 - ref).abs().max().item() < 0.05  # what the int8 rounding moves


def test_int8_rows_keep_their_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 64, generator=gen) * torch.tensor([0.01, 1.0, 300.0]).view(1, 3, 1)
    x[0, 0] = 0  # a zero row: scale 0, values 0
    rows = quantize_rows(x)
    scale = rows[..., 64:].contiguous().view(torch.float32).squeeze(-1)
    assert torch.equal(scale, x.abs().amax(-1) / 127)
    back = dequantize_rows(rows, torch.float32)
    assert (back - x).abs().le(scale.unsqueeze(-1) / 2 + 1e-12).all()  # half a step at most
    assert torch.equal(back[0, 0], torch.zeros(64))
    assert rows[..., :64].abs().max().item() == 127  # each non-zero row uses the full range


def test_two_installs_build_in_folders_of_their_own(tmp_path: Path) -> None:
    """ninja records sources and torch's headers by path: a checkout and a clone (or two venvs)
    sharing one build folder rebuilt each other's kernels at every switch."""
    here = Path(kernels.__file__).parent
    assert kernels.kernel_dir().name.split("-")[0] == _build_tag(here) == _build_tag(here)
    assert _build_tag(tmp_path) != _build_tag(here)
    # The same checkout run from another venv: torch's headers have other paths.
    assert _build_tag(here, tmp_path / "torch") != _build_tag(here)


def test_kernels_build_with_the_pinned_ninja_without_an_activated_venv() -> None:
    """`.venv/bin/surge` run without activating the venv must still build with the venv's ninja:
    another version on PATH cannot read the build log and would rebuild every kernel."""
    pinned = Path(sys.executable).parent / "ninja"
    if not pinned.exists():
        pytest.skip("no ninja installed beside this interpreter")
    code = (
        "import shutil; from surge.models.kernels import _use_pinned_ninja; "
        "_use_pinned_ninja(); print(shutil.which('ninja'))"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(pinned)
