"""What serving LoRA adapters costs: the same batch on the base model, on one adapter, and on a
mix of adapters, in one engine.

The default model and settings, with `--adapters` random rank-`--rank` adapters on every
projection (PEFT's file format, written for SmolLM2's shapes by tests/lora_adapters.py). B
requests of the same prompts decode `--max-tokens` greedy tokens (ignore_eos): all on the base
model, all on one adapter, and spread over every adapter plus the base, alternating, `--rounds`
times each.
Prints output tokens per second for each and the ratio to the base model's.

    python benchmarks/bench_lora.py --batch 1,16 --max-tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from surge.engine.llm import LLM
from surge.models.formats.model_files import open_model
from surge.models.formats.resolve import resolve_model
from surge.sampling_params import SamplingParams
from tests.lora_adapters import write_random_adapter

PROMPTS = [
    "Explain how a paged KV cache works.",
    "Write a short poem about the sea.",
    "What are the three laws of thermodynamics?",
    "Give me a recipe for pancakes.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    path = resolve_model("smollm2-135m")
    spec = open_model(path).spec
    with tempfile.TemporaryDirectory() as tmp:
        names = {
            f"lora{i}": str(write_random_adapter(Path(tmp) / f"a{i}", spec, args.rank, i, 0.02))
            for i in range(args.adapters)
        }
        llm = LLM(str(path), lora_modules=names, max_loras=args.adapters, max_lora_rank=args.rank)
    tok = llm.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    adapter_names = list(names)
    print(f"model {path.name}, {args.adapters} adapters of rank {args.rank} on every projection")
    for b in (int(x) for x in args.batch.split(",")):
        prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(b)]
        modes: dict[str, list[str | None]] = {
            "base": [None] * b,
            "one adapter": [adapter_names[0]] * b,
        }
        if b > 1:  # every adapter and the base model, round robin
            modes["mixed"] = [([None, *adapter_names])[i % (len(names) + 1)] for i in range(b)]
        llm.generate(prompts, params, use_tqdm=False, lora_name=modes["one adapter"])  # warm-up
        rates: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            for mode, loras in modes.items():
                t0 = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False, lora_name=loras)
                dt = time.perf_counter() - t0
                rates[mode].append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
        base = statistics.median(rates["base"])
        for mode, r in rates.items():
            med = statistics.median(r)
            print(f"batch {b:>3}  {mode:<12} {med:8.1f} tok/s  {med / base:5.2f}x base  "
                  f"(rounds: {', '.join(f'{x:.1f}' for x in r)})")  # fmt: skip


if __name__ == "__main__":
    main()
