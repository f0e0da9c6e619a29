"""One stream's decode roofline for a GGUF on this machine: the bytes a token reads over the
measured read bandwidth.

    python benchmarks/roofline.py FILE.gguf [--threads N] [--gib 2]

Decoding one token reads every weight matrix once: every tensor of the file but the token
embedding (a lookup of one row), unless the model ties its LM head to the embedding (no
`output.weight`), where the LM head reads all of it. The read bandwidth is the best of five
passes summing a float32 array of `--gib` GiB (larger than any cache) on all threads, as a decode
step's GEMVs stream their weights. tok/s ceiling = bandwidth / bytes a token; a server's
one-stream tok/s over that ceiling is how close it gets.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from gguf import GGUFReader


def bytes_per_token(path: str) -> tuple[int, int]:
    """(bytes a decode token reads, the file's tensor bytes)."""
    reader = GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    total = sum(sizes.values())
    if "output.weight" in sizes:
        return total - sizes.get("token_embd.weight", 0), total
    return total, total


def read_bandwidth(gib: float, threads: int) -> float:
    """Best GB/s of five full passes over `gib` GiB of float32."""
    torch.set_num_threads(threads)
    x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    x.sum()  # touch every page once
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gib", type=float, default=2.0)
    args = ap.parse_args()
    per_token, total = bytes_per_token(args.file)
    bw = read_bandwidth(args.gib, args.threads)
    print(f"file tensors {total / 1e9:.3f} GB; a decode token reads {per_token / 1e9:.3f} GB")
    print(f"read bandwidth {bw:.1f} GB/s on {args.threads} threads")
    ceiling = bw * 1e9 / per_token
    print(f"one-stream ceiling {ceiling:.2f} tok/s ({per_token / bw / 1e6:.1f} ms a token)")


if __name__ == "__main__":
    main()
