"""GGUF's own blocks run as stored (surge/models/gguf_linear.py, kernels/gguf_blocks.cpp) against
Surge's 4-bit kernel (Q4Linear.from_float on the same dequantized weights: its q4 GEMV up to
its row limit, its int8 copy past it), Int8Linear, and dequantize-the-blocks + float matmul, on
Llama-3.2-1B and Llama-3.1-8B's layer shapes. Weights stream from memory: distinct copies of
each matrix (at least --min-mb in all, past the last-level cache), run in turn. Random valid
blocks (finite float16 scales): speed depends on the shapes, not the values.

Prints ms per call, and at one row the weight bytes read per second (GB/s) of each layer's
own format (the blocks; the q4 layout's 0.625 bytes a weight; int8's 1).

    python benchmarks/bench_gguf_kernel.py [--model 1b|8b|all] [--types Q4_K,Q6_K]
        [--rows 1,16,64,512] [--passes 5] [--min-mb 256] [--no-baselines]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import torch
from torch import Tensor, nn

from surge.models.gguf_linear import GGML_TYPES, GGUFLinear
from surge.models.kernels import GGUF_BLOCKS, load_gguf_blocks, load_int8_linear, load_q4_linear
from surge.models.q4 import Q4Linear
from surge.models.quant import Int8Linear

# (out_features, in_features) of one layer's matrices: q/o, k/v, gate/up, down.
SHAPES = {
    "1b": [(2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)],
    "8b": [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)],
}
F16_AT = {2: [0], 3: [0, 2], 8: [0], 12: [0, 2], 13: [0, 2], 14: [208]}  # float16 offsets


def random_blocks(qtype: int, n: int, k: int, rng: np.random.Generator) -> Tensor:
    """Random bytes with small finite float16 scales: valid blocks of any format."""
    weights, size = GGUF_BLOCKS[qtype]
    raw = rng.integers(0, 256, size=(n, k // weights, size), dtype=np.uint8)
    for at in F16_AT[qtype]:
        scale = (rng.standard_normal((n, k // weights)) * 0.002).astype(np.float16)
        raw[..., at : at + 2] = scale.view(np.uint8).reshape(n, k // weights, 2)
    return torch.from_numpy(raw.reshape(n, -1))


Call = Callable[[nn.Module, Tensor], Tensor]


def forward(layer: nn.Module, x: Tensor) -> Tensor:
    out: Tensor = layer(x)
    return out


def dequantize_matmul(layer: nn.Module, x: Tensor) -> Tensor:
    """The blocks dequantized (compiled, every core) then a float matmul, per call."""
    assert isinstance(layer, GGUFLinear)
    return x @ layer.dequantize().t()


def timed(fns: Sequence[Callable[[], object]], passes: int) -> float:
    """Median seconds per call over `passes` rounds of calling every fn (one per copy)."""
    for fn in fns:  # warm: page faults, thread pool, buffers
        fn()
    per_call = []
    for _ in range(passes):
        t0 = time.perf_counter()
        for fn in fns:
            fn()
        per_call.append((time.perf_counter() - t0) / len(fns))
    return statistics.median(per_call)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="all", choices=["1b", "8b", "all"])
    ap.add_argument("--types", default="Q4_0,Q8_0,Q4_K,Q5_K,Q6_K")
    ap.add_argument("--rows", default="1,16,64,512")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--min-mb", type=float, default=256.0, help="weights streamed per round")
    ap.add_argument("--no-baselines", action="store_true", help="only the GGUF blocks")
    args = ap.parse_args()
    if None in (load_gguf_blocks(), load_q4_linear(), load_int8_linear()):
        raise SystemExit("the compiled kernels cannot be built here")
    rng = np.random.default_rng(0)
    shapes = [s for m in ("1b", "8b") if args.model in (m, "all") for s in SHAPES[m]]
    rows = [int(r) for r in args.rows.split(",")]
    print(f"threads {torch.get_num_threads()}; ms per call (GB/s of weights read at 1 row)")
    for n, k in shapes:
        for name in args.types.split(","):
            qtype = GGML_TYPES[name]
            one = random_blocks(qtype, n, k, rng)
            copies = max(1, min(16, int(args.min_mb * 2**20 / one.numel()) + 1))
            layers: list[nn.Module] = [GGUFLinear(one, qtype, n, k)]
            layers += [GGUFLinear(one.clone(), qtype, n, k) for _ in range(copies - 1)]
            # label -> (the layers, weight bytes of one, how one is called)
            runs: dict[str, tuple[list[nn.Module], float, Call]] = {
                name: (layers, float(one.numel()), forward)
            }
            if not args.no_baselines:
                dense = nn.Linear(k, n, bias=False)
                with torch.no_grad():
                    dense.weight.copy_(layers[0].dequantize())  # type: ignore[operator]
                q4 = [Q4Linear.from_float(dense, kernels=True) for _ in range(copies)]
                i8 = [Int8Linear.from_float(dense, "int8", kernels=True) for _ in range(copies)]
                del dense
                runs["q4"] = (list(q4), n * k * 0.625, forward)
                runs["int8"] = (list(i8), n * k * 1.0, forward)
                runs["deq+mm"] = (layers, float(one.numel()), dequantize_matmul)
            for m_rows in rows:
                x = torch.randn(m_rows, k)
                cells = []
                for label, (mods, nbytes, call) in runs.items():
                    if label == "deq+mm" and m_rows == 1:
                        continue  # dequantizing for one row is never the choice
                    fns = [partial(call, mod, x) for mod in mods]
                    with torch.inference_mode():
                        s = timed(fns, args.passes)
                    gbs = f" {nbytes / s / 1e9:5.1f} GB/s" if m_rows == 1 else ""
                    cells.append(f"{label} {s * 1e3:8.3f} ms{gbs}")
                print(f"{n:6d}x{k:<6d} {name:5s} M={m_rows:<4d} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
