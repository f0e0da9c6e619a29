"""The 4-bit block kernel against int8 (the packed W8A8 GEMM where the kernels build),
weights streaming from memory: 30 layers' worth of SmolLM2-135M's four matrices (qkv, o,
gate_up, down), distinct copies, run in order like a decode step's layers; and, with --against
REV, against the 4-bit kernel as it was at that git revision (built under another op
namespace), interleaved.

    python benchmarks/bench_q4_kernel.py [--rows 1] [--rounds 2] [--passes 20] [--against REV]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from old_kernel import build_old

from surge.models.kernels import load_int8_linear, load_q4_linear
from surge.models.q4 import quantize_q4
from surge.models.quant import Int8Linear, quantize_int8

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K) of one layer
LAYERS = 30


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1, help="activation rows (tokens in the step)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--against", help="git revision of an older q4_linear.cpp to compare")
    args = ap.parse_args()
    if load_q4_linear() is None or load_int8_linear() is None:
        raise SystemExit("the compiled kernels cannot be built here")
    torch.manual_seed(0)
    q4w: list[tuple[torch.Tensor, torch.Tensor]] = []
    i8w: list[Int8Linear] = []
    for _ in range(LAYERS):
        for n, k in SHAPES:
            w = torch.randn(n, k) * 0.05
            q4w.append(quantize_q4(w))
            i8w.append(Int8Linear(*quantize_int8(w), kernels=True))
    xs = {k: torch.randn(args.rows, k).bfloat16() for k in (576, 1536)}

    def q4_runner(op: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            for qs, dm in q4w:
                op(xs[qs.shape[1] * 2], qs, dm, None)

        return run

    def run_int8() -> None:
        for layer in i8w:
            layer(xs[layer.in_features])

    runs: list[tuple[str, Callable[[], None]]] = [("q4", q4_runner(torch.ops.surge.q4_gemv))]
    if args.against:
        build_old("q4_linear", args.against)
        old = torch.ops.surge_old.q4_gemv
        qs, dm = q4w[0]
        x = xs[qs.shape[1] * 2]
        diff = old(x, qs, dm, None).float() - torch.ops.surge.q4_gemv(x, qs, dm, None).float()
        print(f"largest difference against {args.against}: {diff.abs().max().item():.2e}")
        runs.append((f"q4@{args.against}", q4_runner(old)))
    runs.append(("int8", run_int8))
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    for r in range(args.rounds):
        # Alternate the order: with identical kernels under both names, whichever ran first in
        # every round measured ~10% slower at 1 row.
        for name, fn in runs if r % 2 == 0 else runs[::-1]:
            fn()
            t = time.perf_counter()
            for _ in range(args.passes):
                fn()
            dt = (time.perf_counter() - t) / args.passes
            times[name].append(dt)
            print(f"{name:12s} {dt * 1e3:6.2f} ms per {LAYERS} layers, {args.rows} row(s)")
    if args.rounds > 1:
        for name, ts in times.items():
            print(f"median {name:12s} {statistics.median(ts) * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
