"""What prompt-lookup speculative decoding buys: the same requests with and without drafts.

The default model and settings, one engine without drafts and one per `--k` (draft tokens per
step), in one process. Three kinds of chat request, greedy, `--max-tokens` each: "copy" (repeat
a paragraph), "edit" (rename functions in a piece of code: mostly copied), "free" (an
open-ended question: little to copy, so it shows what failed drafts cost). Each kind runs at
every `--batch` size (that many requests of it at once), the engines alternating, `--rounds`
times. Prints output tok/s (median of the rounds), the ratio to no drafts, the share of draft
tokens accepted, and whether the texts were identical to the run without drafts.

    python benchmarks/bench_speculative.py --batch 1,8 --k 4,8 --max-tokens 128 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams

PARAGRAPH = (
    "Paged attention keeps the KV cache in fixed-size blocks, so memory is not wasted on "
    "padding. Continuous batching lets new requests join the running batch at every step, and "
    "prefix caching lets requests that share a system prompt reuse its keys and values."
)
CODE = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n    return a / b\n"
)
KINDS = {
    "copy": f"Repeat this text exactly:\n{PARAGRAPH}",
    "edit": f"Rename every function to start with 'op_' and return the whole code:\n{CODE}",
    "free": "Write a short story about a lighthouse keeper.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--k", default="4,8", help="draft tokens per step, one engine each")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ks = [int(x) for x in args.k.split(",")]
    engines = {0: LLM("smollm2-135m")} | {k: LLM("smollm2-135m", num_speculative_tokens=k)
                                          for k in ks}  # fmt: skip
    tok = engines[0].tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    print(f"model {engines[0].engine.files.path.name}; greedy, max_tokens {args.max_tokens}")
    for kind, text in KINDS.items():
        prompt = tok.apply_chat_template([{"role": "user", "content": text}])
        for b in (int(x) for x in args.batch.split(",")):
            prompts = [prompt] * b
            rates: dict[int, list[float]] = {k: [] for k in engines}
            texts: dict[int, list[str]] = {}
            accepted: dict[int, float] = {}
            for llm in engines.values():
                llm.generate(prompts[:1], SamplingParams(max_tokens=2), use_tqdm=False)
            for _ in range(args.rounds):
                for k, llm in engines.items():
                    before = llm.engine.stats()
                    t0 = time.perf_counter()
                    outs = llm.generate(prompts, params, use_tqdm=False)
                    dt = time.perf_counter() - t0
                    after = llm.engine.stats()
                    rates[k].append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
                    texts[k] = [o.outputs[0].text for o in outs]
                    drafted = after.spec.draft_tokens - before.spec.draft_tokens
                    hits = after.spec.accepted_tokens - before.spec.accepted_tokens
                    accepted[k] = hits / drafted if drafted else 0.0
            base = statistics.median(rates[0])
            for k, r in rates.items():
                med = statistics.median(r)
                same = "same text" if texts[k] == texts[0] else "TEXT DIFFERS"
                print(f"{kind:<5} batch {b:>2}  k={k}  {med:7.1f} tok/s  {med / base:5.2f}x  "
                      f"accepted {accepted[k]:4.0%}  {same}  "
                      f"(rounds: {', '.join(f'{x:.1f}' for x in r)})")  # fmt: skip


if __name__ == "__main__":
    main()
