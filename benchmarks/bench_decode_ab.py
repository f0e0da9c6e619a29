"""One-request decode step time of several quantizations, interleaved in one process so that
this machine's drift between runs falls on all of them alike.

    python benchmarks/bench_decode_ab.py [--quantizations int8,q4] [--rounds 6] [--steps 40]
        [--no-compile]

Each configuration decodes one ~100-token request; rounds alternate between them, each round
the median of `steps` engine steps. Compiled configurations build only the one-row graph.
"""

from __future__ import annotations

import argparse
import statistics
import time

from surge import LLM, SamplingParams
from surge.engine.outputs import EngineCoreRequest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quantizations", default="int8,q4")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    compile_ = not args.no_compile
    llms = {
        q: LLM(
            "smollm2-135m",
            quantization=q,
            compile=compile_,
            compile_warmup=False,
            max_num_seqs=4,
        )
        for q in args.quantizations.split(",")
    }
    text = "Large language models are served to many users at once by batching requests. " * 8
    params = SamplingParams(temperature=0.0, max_tokens=1_000_000, ignore_eos=True)
    for name, llm in llms.items():
        llm.engine.add_request(EngineCoreRequest(name, llm.tokenizer.encode(text)[:100], params))
        for _ in range(8):  # the prefill, then the first decodes (and the compile)
            llm.engine.step()
    rounds: dict[str, list[float]] = {name: [] for name in llms}
    for _ in range(args.rounds):
        for name, llm in llms.items():
            times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                llm.engine.step()
                times.append(time.perf_counter() - t)
            rounds[name].append(statistics.median(times) * 1e3)
    what = "compiled" if compile_ else "eager"
    for name, ms in rounds.items():
        per_round = " ".join(f"{x:.2f}" for x in ms)
        tok_s = 1000 / statistics.median(ms)
        print(f"{name:10s} ({what}) step ms per round: {per_round}  -> {tok_s:.1f} tok/s")


if __name__ == "__main__":
    main()
