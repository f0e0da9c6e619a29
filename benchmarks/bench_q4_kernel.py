"""The 4-bit block kernel against int8 (its GEMV up to 8 rows, W8A8 above), weights streaming
from memory: 30 layers' worth of SmolLM2-135M's four matrices (qkv, o, gate_up, down), distinct
copies, run in order like a decode step's layers.

    python benchmarks/bench_q4_kernel.py [--rows 1] [--rounds 2] [--passes 20]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

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

    def run_q4() -> None:
        for qs, dm in q4w:
            torch.ops.surge.q4_gemv(xs[qs.shape[1] * 2], qs, dm, None)

    def run_int8() -> None:
        for layer in i8w:
            layer(xs[layer.in_features])

    runs: list[tuple[str, Callable[[], None]]] = [("q4", run_q4), ("int8", run_int8)]
    for _ in range(args.rounds):
        for name, fn in runs:
            fn()
            t = time.perf_counter()
            for _ in range(args.passes):
                fn()
            dt = (time.perf_counter() - t) / args.passes
            print(f"{name:5s} {dt * 1e3:6.2f} ms per {LAYERS} layers, {args.rows} row(s)")


if __name__ == "__main__":
    main()
