"""The packed W8A8 GEMM (surge::w8a8_linear) against the two other int8 paths, weights streaming
from memory: 30 layers' worth of SmolLM2-135M's four matrices (qkv, o, gate_up, down), distinct
copies, run in order like a step's layers, bf16 activations, interleaved rounds.

    python benchmarks/bench_w8a8.py [--rows 1,16,64] [--rounds 3]

"int_mm": quantize_rows + torch._int_mm + dequantize_int32 (the W8A8 path before the packed GEMM;
the same sums); "gemv": the int16-activation GEMV (int8_gemv), only up to 8 rows, where it runs.
Prints median ms per 30 layers and GOP/s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from surge.models.kernels import load_int8_linear, load_w8a8_linear
from surge.models.quant import pack_int8

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # (K, N)
LAYERS = 30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    assert load_int8_linear() is not None and load_w8a8_linear() is not None, "no kernels here"
    gen = torch.Generator().manual_seed(0)
    weights: Weights = []
    for _ in range(LAYERS):
        for k, n in SHAPES:
            q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
            scale = torch.rand(n, generator=gen) + 0.5
            weights.append((q, pack_int8(q), scale, q.sum(dim=1, dtype=torch.int32), k))
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=gen).bfloat16() for k in (576, 1536)}
        runs = {"packed": packed, "int_mm": int_mm} | ({"gemv": gemv} if rows <= 8 else {})
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, fn in runs.items():
                fn(weights, xs)  # the previous run's weights are out of cache: all from memory
                t = time.perf_counter()
                fn(weights, xs)
                times[name].append((time.perf_counter() - t) * 1e3)
        gop = sum(2 * rows * q.shape[0] * q.shape[1] for q, *_ in weights) / 1e9
        for name, ms in times.items():
            med = statistics.median(ms)
            print(
                f"{rows:3d} rows  {name:7s} {med:7.2f} ms / 30 layers  {gop / med * 1e3:5.0f} GOP/s"
            )


Weights = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]]


def packed(weights: Weights, xs: dict[int, torch.Tensor]) -> None:
    for _, p, s, wsum, k in weights:
        torch.ops.surge.w8a8_linear(xs[k], p, s, wsum, None, None)


def int_mm(weights: Weights, xs: dict[int, torch.Tensor]) -> None:
    ops = torch.ops.surge
    for q, _, s, wsum, k in weights:
        xq, sx, zx = ops.quantize_rows(xs[k])
        acc = torch._int_mm(xq, q.t())
        ops.dequantize_int32(acc, sx, zx, s, wsum, None, torch.bfloat16)


def gemv(weights: Weights, xs: dict[int, torch.Tensor]) -> None:
    for q, _, s, _, k in weights:
        torch.ops.surge.int8_gemv(xs[k], q, s, None)


if __name__ == "__main__":
    main()
