"""The paged decode attention kernel against the same kernel at another git revision, interleaved
in one process (this machine drifts between runs). The old source is built under another op
namespace (surge_old), so both run side by side on the same tensors.

    python benchmarks/bench_paged_decode.py [--against a7cab5d] [--rounds 5] [--dtype float32]
        [--layout sequential]

SmolLM2-135M's shapes (9 query heads, 3 KV heads, head size 64, a bf16 cache unless --dtype,
16-token
blocks); each layer has its own cache, as in the model, so 30 layers' KV comes from memory, not
cache; a request's blocks are scattered over the pool (as after churn and prefix-cache reuse), or
in order with --layout sequential (as a fresh pool hands them out). `--pool-blocks N` makes each
layer's pool N blocks (the engine's 2 GiB default on a CPU is about 2,500 of SmolLM2's bf16
blocks, 4,900 int8) instead of just enough, so that scattered blocks miss the TLB as they do
there; `--small-pages` keeps the caches off huge pages (the engine asks for them). Prints ms for
30 layers, old / new, and the largest output difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from old_kernel import build_old

from surge.engine.runner import huge_pages
from surge.models.kernels import load_paged_decode
from surge.models.kv_quant import quantize_rows

SHAPES = [(1, 150), (8, 150), (64, 140), (64, 500)]  # (requests, tokens in context)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default="a7cab5d", help="git revision of the old kernel")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layout", default="scattered", choices=["scattered", "sequential"])
    ap.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16", "int8"],
        help="the cache's (int8: rows quantized as the engine writes them, float32 queries)",
    )  # fmt: skip
    ap.add_argument("--pool-blocks", type=int, default=0, help="blocks a layer (0: just enough)")
    ap.add_argument("--small-pages", action="store_true", help="caches not on huge pages")
    args = ap.parse_args()
    assert load_paged_decode() is not None, "the kernel does not build here"
    build_old("paged_decode", args.against)
    ops = {"old": torch.ops.surge_old.paged_decode, "new": torch.ops.surge.paged_decode}
    heads, kv_heads, head_dim, block, layers = 9, 3, 64, 16, 30
    int8 = args.dtype == "int8"
    dtype = torch.float32 if int8 else getattr(torch, args.dtype)  # the queries'
    to_dtype = quantize_rows if int8 else (lambda x: x.to(dtype))

    def as_cache(x: torch.Tensor) -> torch.Tensor:
        rows = to_dtype(x)
        if args.small_pages:
            return rows
        return huge_pages.zeros(tuple(rows.shape), rows.dtype, rows.device).copy_(rows)

    gen = torch.Generator().manual_seed(0)
    for d, length in SHAPES:
        blocks_per_req = (length + block - 1) // block
        pool = max(d * blocks_per_req + 8, args.pool_blocks)
        shape = (kv_heads, pool, block, head_dim)
        caches = [
            (
                as_cache(torch.randn(shape, generator=gen)),
                as_cache(torch.randn(shape, generator=gen)),
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
