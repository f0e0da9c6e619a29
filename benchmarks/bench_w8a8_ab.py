"""The packed W8A8 GEMM (surge::w8a8_linear) of this tree against the same op at another git
revision, interleaved in one process (old_kernel.py builds the old source under surge_old):
30 layers' worth of SmolLM2-135M's four int8 matrices, distinct copies streaming from memory
as in a step, bf16 activations, at several row counts.

    python benchmarks/bench_w8a8_ab.py --against REV [--rows 1,2,3,8,12,64] [--rounds 6]
        [--amx MIN_ROWS]

--amx runs both builds' AMX kernel from MIN_ROWS rows on (set_amx; on a CPU with AMX-INT8).

Prints the median ms per 30 layers of each and old/new (above 1: this tree faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from old_kernel import build_old

from surge.models.kernels import load_w8a8_linear
from surge.models.quant import pack_int8, quantize_int8

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30  # (K, N), 30 layers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", required=True, help="git revision of the old kernel")
    ap.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 2, 3, 4, 8, 9, 12, 13, 16, 20, 64, 256])  # fmt: skip
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--amx", type=int, default=0, help="AMX tiles from this many rows (0: off)")
    args = ap.parse_args()
    module = load_w8a8_linear()
    if module is None:
        raise SystemExit("the compiled kernels do not build here")
    old_module = build_old("w8a8_linear", args.against)
    if args.amx:
        for m in (module, old_module):
            if not hasattr(m, "set_amx") or not m.set_amx(1, args.amx):
                raise SystemExit("--amx: a build without the AMX kernel, or no AMX here")
    ops = {"new": torch.ops.surge.w8a8_linear, "old": torch.ops.surge_old.w8a8_linear}
    torch.manual_seed(0)
    weights = []
    for k, n in SHAPES:
        q, scale = quantize_int8(torch.randn(n, k))
        weights.append((pack_int8(q), scale, q.sum(dim=1, dtype=torch.int32)))
    print(f"30 layers of int8 matrices, new = this tree, old = {args.against}")
    for m in args.rows:
        xs = {k: torch.randn(m, k).bfloat16() for k in (576, 1536)}
        took: dict[str, list[float]] = {"new": [], "old": []}
        for rnd in range(args.rounds + 1):  # round 0 warms up
            for name in ("new", "old") if rnd % 2 else ("old", "new"):
                t = time.perf_counter()
                for (k, _), (packed, scale, wsum) in zip(SHAPES, weights, strict=True):
                    ops[name](xs[k], packed, scale, wsum, None, None)
                if rnd:
                    took[name].append(time.perf_counter() - t)
        new, old = statistics.median(took["new"]), statistics.median(took["old"])
        print(f"  {m:5d} rows: new {new * 1e3:7.2f} ms  old {old * 1e3:7.2f} ms  "
              f"old/new {old / new:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
