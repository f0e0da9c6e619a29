"""How far greedy output holds across batch compositions: each prompt alone vs all 64 at once.

fp32 is exact in the tests; bf16 rounds differently for different matmul shapes, so a near-tie
between two tokens can flip. Prints how many of the 64 outputs are identical and where the others
first diverge.

    python benchmarks/batch_invariance.py [--dtype bfloat16] [--prompts 64] [--tokens 32]
"""

from __future__ import annotations

import argparse

from surge import LLM, SamplingParams

TOPICS = ["the sea", "a city", "machines", "music", "winter", "a garden", "the moon", "trains"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    llm = LLM("smollm2-135m", dtype=args.dtype, quantization="none")  # the float paths
    prompts = [f"Write sentence {i} about {TOPICS[i % len(TOPICS)]}:" for i in range(args.prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    alone = [llm.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    diverge = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), None)
        for x, y in zip(batched, alone, strict=True)
    ]
    same = sum(d is None for d in diverge)
    firsts = sorted(d for d in diverge if d is not None)
    print(f"{args.dtype}: {same}/{len(prompts)} identical over {args.tokens} tokens; "
          f"first divergence at token {firsts}")  # fmt: skip


if __name__ == "__main__":
    main()
