"""How far greedy output holds across batch compositions: each prompt alone vs all 64 at once.

The float paths (`--quantization none`): fp32 is exact in the tests; bf16 rounds differently for
different matmul shapes, so a near-tie between two tokens can flip. The default quantized path
(`--quantization auto`: q4 on the fused stack) takes its 4-bit weights for steps of a few rows
and their int8 copies for more, so a request alone and in a batch round differently;
`--batch-invariant` runs every step on one kernel and reduction order (docs/precision.md).
Prints how many of the outputs are identical and where the others first diverge, and the
seconds each pass took.

    python benchmarks/batch_invariance.py [--dtype bfloat16] [--quantization none]
        [--batch-invariant] [--prompts 64] [--tokens 32]
"""

from __future__ import annotations

import argparse
import time

from surge import LLM, SamplingParams

TOPICS = ["the sea", "a city", "machines", "music", "winter", "a garden", "the moon", "trains"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quantization", default="none", help="none: the float paths; auto: q4")
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    llm = LLM(
        "smollm2-135m",
        dtype=args.dtype,
        quantization=args.quantization,
        batch_invariant=args.batch_invariant,
    )
    prompts = [f"Write sentence {i} about {TOPICS[i % len(TOPICS)]}:" for i in range(args.prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    t0 = time.perf_counter()
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    t1 = time.perf_counter()
    alone = [llm.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    t2 = time.perf_counter()
    diverge = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
        for x, y in zip(batched, alone, strict=True)
    ]
    same = sum(d is None for d in diverge)
    firsts = sorted(d for d in diverge if d is not None)
    mode = f"{args.dtype} {args.quantization}" + (
        " batch-invariant" if args.batch_invariant else ""
    )
    print(f"{mode}: {same}/{len(prompts)} identical over {args.tokens} tokens; "
          f"first divergence at token {firsts}; batched {t1 - t0:.1f} s, "
          f"one at a time {t2 - t1:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
