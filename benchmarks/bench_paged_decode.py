"""The paged decode attention kernel against the same kernel at another git revision, interleaved
in one process (this machine drifts between runs). The old source is built under another op
namespace (surge_old), so both run side by side on the same tensors.

    python benchmarks/bench_paged_decode.py [--against a7cab5d] [--rounds 5] [--dtype float32]
        [--layout sequential]

SmolLM2-135M's shapes (9 query heads, 3 KV heads, head size 64, bf16 unless --dtype, 16-token
blocks); each layer has its own cache, as in the model, so 30 layers' KV comes from memory, not
cache; a request's blocks are scattered over the pool (as after churn and prefix-cache reuse), or
in order with --layout sequential (as a fresh pool hands them out). Prints ms for 30 layers,
old / new, and the largest output difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from old_kernel import build_old

from surge.models.kernels import load_paged_decode

SHAPES = [(1, 150), (8, 150), (64, 140), (64, 500)]  # (requests, tokens in context)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default="a7cab5d", help="git revision of the old kernel")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layout", default="scattered", choices=["scattered", "sequential"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    args = ap.parse_args()
    assert load_paged_decode() is not None, "the kernel does not build here"
    build_old("paged_decode", args.against)
    ops = {"old": torch.ops.surge_old.paged_decode, "new": torch.ops.surge.paged_decode}
    heads, kv_heads, head_dim, block, layers = 9, 3, 64, 16, 30
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    for d, length in SHAPES:
        blocks_per_req = (length + block - 1) // block
        pool = d * blocks_per_req + 8
        shape = (kv_heads, pool, block, head_dim)
        caches = [
            (
                torch.randn(shape, generator=gen).to(dtype),
                torch.randn(shape, generator=gen).to(dtype),
            )
            for _ in range(layers)
        ]
        q = torch.randn(d, heads, head_dim, generator=gen).to(dtype)
        scattered = args.layout == "scattered"
        order = torch.randperm(pool, generator=gen) if scattered else torch.arange(pool)
        tables = order[: d * blocks_per_req].view(d, -1).contiguous()
        lens = torch.full((d,), length, dtype=torch.long)
        outs = [op(q, *caches[0], tables, lens, 0.125).float() for op in ops.values()]
        diff = (outs[0] - outs[1]).abs().max().item()
        times: dict[str, list[float]] = {name: [] for name in ops}
        for _ in range(args.rounds):
            for name, op in ops.items():
                t = time.perf_counter()
                for _ in range(4):
                    for k, v in caches:
                        op(q, k, v, tables, lens, 0.125)
                times[name].append((time.perf_counter() - t) / 4 * 1e3)
        old, new = (statistics.median(times[n]) for n in ("old", "new"))
        print(
            f"{d:3d} requests x {length} tokens: 30 layers {old:.2f} ms ({args.against}) -> "
            f"{new:.2f} ms, {old / new:.2f}x; max |diff| {diff:.1e}"
        )


if __name__ == "__main__":
    main()
