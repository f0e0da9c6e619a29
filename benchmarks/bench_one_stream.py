"""One streamed completion at a time, alternating between servers (this machine drifts between
runs, so rounds interleave): time per output token (TPOT, gaps between streamed chunks) per round.

    python benchmarks/bench_one_stream.py --url NAME=http://127.0.0.1:18081 \
        --url surge=http://127.0.0.1:18090 [--rounds 12] [--tokens 256]

Any OpenAI-compatible server (llama.cpp's llama-server, Surge) with a model named "default"
(--served-model-name default); greedy, ignore_eos, so every stream is `--tokens` long.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from openai import OpenAI


def tpot_ms(client: OpenAI, tokens: int) -> float:
    stamps = []
    stream = client.completions.create(
        model="default",
        prompt="Once upon a time, in a land far away,",
        max_tokens=tokens,
        stream=True,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    for _ in stream:
        stamps.append(time.perf_counter())
    gaps = [b - a for a, b in itertools.pairwise(stamps[1:])]  # after the first token
    return statistics.median(gaps) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", action="append", required=True, help="NAME=URL, two or more")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    clients = {}
    for spec in args.url:
        name, url = spec.split("=", 1)
        clients[name] = OpenAI(base_url=f"{url}/v1", api_key="none")
    rounds: dict[str, list[float]] = {name: [] for name in clients}
    for r in range(args.rounds):
        for name, client in clients.items():
            rounds[name].append(tpot_ms(client, args.tokens))
        print(f"round {r + 1}: " + "  ".join(f"{n} {v[-1]:.2f} ms" for n, v in rounds.items()))
    for name, ms in rounds.items():
        med = statistics.median(ms)
        print(f"{name:12s} TPOT median of rounds {med:.2f} ms -> {1000 / med:.1f} tok/s")


if __name__ == "__main__":
    main()
