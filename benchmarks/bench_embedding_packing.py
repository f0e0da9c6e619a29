"""Packed against padded batches of the embedding model, interleaved in one process.

A padded batch runs every input at the longest input's length; the packed batch (what surge
runs) gives the dense layers only real tokens. The padded cost is measured by running the same
encoder on inputs filled out with [PAD] to the longest (the same GEMM shapes a padded encoder
runs). Inputs: random sentences of 6-30 words, as bench_embeddings.py sends.

    python benchmarks/bench_embedding_packing.py --batch-sizes 1,8,32 --reps 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_embeddings import sentence

from surge.models.embedding import EmbeddingModel
from surge.models.formats.resolve import DEFAULT_EMBEDDING_MODEL, resolve_model


def timed(model: EmbeddingModel, batch: list[list[int]], reps: int) -> float:
    model.embed(batch)
    start = time.perf_counter()
    for _ in range(reps):
        model.embed(batch)
    return (time.perf_counter() - start) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = EmbeddingModel.load(resolve_model(DEFAULT_EMBEDDING_MODEL))
    pad = model.tokenizer.token_to_id("[PAD]")
    rng = random.Random(0)
    print(
        f"{'batch':>5} {'tokens':>6} {'padded':>6} {'packed ms':>9} {'padded ms':>9} {'ratio':>6}"
    )
    for size in [int(s) for s in args.batch_sizes.split(",")]:
        batch = [model.tokenize(sentence(rng)) for _ in range(size)]
        longest = max(len(ids) for ids in batch)
        padded = [ids + [pad] * (longest - len(ids)) for ids in batch]
        packed_s, padded_s = [], []
        for _ in range(args.rounds):
            packed_s.append(timed(model, batch, args.reps))
            padded_s.append(timed(model, padded, args.reps))
        a, b = statistics.median(packed_s), statistics.median(padded_s)
        tokens = sum(len(ids) for ids in batch)
        print(f"{size:>5} {tokens:>6} {size * longest:>6} {a * 1e3:>9.1f} {b * 1e3:>9.1f} "
              f"{b / a:>5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
