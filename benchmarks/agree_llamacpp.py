"""Greedy tokens of Surge's engine against llama.cpp's `llama-server` on the same GGUF file:
how many outputs are identical, their mean common prefix, and the share of equal positions.

    llama-server -m FILE.gguf --host 127.0.0.1 --port 18081 -np 1 -c 4096 -t 2 &
    python benchmarks/agree_llamacpp.py [--url http://127.0.0.1:18081] [--model smollm2-135m]
        [--quantization auto] [--prompts 50] [--tokens 32]

Prompts are the first N lines of tests/data/prompts.txt; llama.cpp's tokens come from its
/completion endpoint (`return_tokens`), so no detokenization stands between the two.
"""

from __future__ import annotations

import argparse
import json
import statistics
import urllib.request
from pathlib import Path

from surge import LLM, SamplingParams

PROMPTS = Path(__file__).resolve().parent.parent / "tests" / "data" / "prompts.txt"


def llamacpp_tokens(url: str, prompt: str, tokens: int) -> list[int]:
    body = {
        "prompt": prompt,
        "n_predict": tokens,
        "temperature": 0,
        "return_tokens": True,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    req = urllib.request.Request(
        f"{url}/completion", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req) as resp:
        return list(json.load(resp)["tokens"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:18081")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    prompts = PROMPTS.read_text().splitlines()[: args.prompts]
    llm = LLM(args.model, device="cpu", quantization=args.quantization)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    prefixes, equal = [], 0
    for prompt, mine in zip(prompts, ours, strict=True):
        theirs = llamacpp_tokens(args.url, prompt, args.tokens)
        n = 0
        while n < min(len(mine), len(theirs)) and mine[n] == theirs[n]:
            n += 1
        prefixes.append(n)
        equal += sum(a == b for a, b in zip(mine, theirs, strict=False))
    identical = sum(p == args.tokens for p in prefixes)
    print(
        f"{args.quantization}: {len(prompts)} prompts x {args.tokens} tokens: identical "
        f"{identical}/{len(prompts)}, mean common prefix {statistics.mean(prefixes):.1f}, "
        f"positions equal {equal / (len(prompts) * args.tokens):.1%}"
    )


if __name__ == "__main__":
    main()
