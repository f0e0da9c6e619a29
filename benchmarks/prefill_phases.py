"""Where a fresh prefill's time goes: the fused stack's phase timers over one prompt, median of
rounds, with the engine the process chose (SURGE_AMX picks it: run once with `off` and once with
the default to compare the VNNI and AMX engines in one sitting).

    SURGE_AMX=off python benchmarks/prefill_phases.py [--length 1024] [--rounds 5] [--new 0]
        [--prompts 1]

Each round prefills a fresh slice of Pride and Prejudice (no prefix-cache hit) for one token;
with `--new N`, that prefill is untimed and the round times the same prompt with N tokens more
(a prefix-cache hit: a step of N rows against the cached keys). Two warm-up rounds first.
With `--prompts N`, each round prefills N fresh prompts at once (a wave of arrivals, as a
closed-loop benchmark's clients send them; the scheduler's token budget splits it into steps).
Prints the timed step's median and each phase's median (ms).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench_prefill_attention import DATA, fused_path, run_all

from surge import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=0, help="time a cache hit of this many tokens")
    ap.add_argument("--prompts", type=int, default=1, help="fresh prompts prefilled at once")
    args = ap.parse_args()
    llm = LLM("smollm2-135m", max_num_seqs=max(4, args.prompts), enable_prefix_caching=args.new > 0)
    stack = fused_path(llm).fused.stack
    chapter = llm.tokenizer.encode((DATA / "pride_and_prejudice_ch1.txt").read_text())
    starts = args.prompts * (args.rounds + 2)  # a distinct start for every prompt
    ids = chapter * (2 + (131 * starts + args.length + args.new) // len(chapter))
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    total: list[float] = []
    phases: dict[str, list[float]] = {}
    for r in range(args.rounds + 2):
        firsts = [(r * args.prompts + i) * 131 for i in range(args.prompts)]  # fresh prefixes
        prompts = [ids[f : f + args.length] for f in firsts]
        if args.new:
            run_all(llm, prompts, one)  # cached from here on
            prompts = [ids[f : f + args.length + args.new] for f in firsts]
        stack.phase_seconds()  # reset
        t = time.perf_counter()
        run_all(llm, prompts, one)
        took = time.perf_counter() - t
        timers = dict(stack.phase_seconds())
        if r >= 2:
            total.append(took * 1e3)
            for name, sec in timers.items():
                phases.setdefault(name, []).append(sec * 1e3)
    med = {name: statistics.median(v) for name, v in phases.items()}
    what = (
        f"{args.new} new tokens after {args.length} cached"
        if args.new
        else f"{args.length}-token prefill"
    )
    if args.prompts > 1:
        tokens = args.prompts * (args.new or args.length)
        what = f"{args.prompts} x {what} ({tokens / statistics.median(total) * 1e3:.0f} tok/s)"
    print(f"SURGE_AMX={os.environ.get('SURGE_AMX', 'auto')}: {what} "
          f"{statistics.median(total):.1f} ms, the stack {sum(med.values()):.1f} ms:")  # fmt: skip
    print("  " + ", ".join(f"{name} {ms:.1f}" for name, ms in med.items()))


if __name__ == "__main__":
    main()
