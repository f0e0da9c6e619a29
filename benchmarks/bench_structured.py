"""What structured output costs per decode step: the same batch free and under a JSON schema.

One engine (the default model and settings), batches of B chat requests asking for a JSON
description of a city, run free (plain greedy text, ignore_eos, the same max_tokens) and
constrained by a JSON schema, alternating, `--rounds` times each. Prints the engine's mean step
time for each and their ratio, the time the masks took per step (llguidance's bitmask and
applying it, measured inside the sampler), and how many constrained answers were whole JSON
within max_tokens (the rest were cut by it: the model writes long descriptions).

    python benchmarks/bench_structured.py --batch 1,8,32 --max-tokens 160 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import surge.engine.sample.logits_processors as processors_module
from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams
from surge.structured_output import StructuredOutput

CITIES = ["Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Delhi", "Quito", "Seoul"]
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
        "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "description": {"type": "string"},
    },
    "required": ["city", "country", "population", "landmarks", "description"],
    "additionalProperties": False,
}

mask_s = 0.0  # in the two functions the sampler calls for constrained rows


def _timed(fn):  # type: ignore[no-untyped-def]
    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        global mask_s
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            mask_s += time.perf_counter() - t0

    return timed


processors_module.token_bitmask = _timed(processors_module.token_bitmask)  # type: ignore[assignment]
processors_module.apply_token_bitmask_ = _timed(processors_module.apply_token_bitmask_)  # type: ignore


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, int, list[str]]:
    """(seconds per engine step, steps, texts)."""
    steps0 = llm.engine.stats().steps.num_steps
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    steps = llm.engine.stats().steps.num_steps - steps0
    return elapsed / steps, steps, [o.outputs[0].text for o in outs]


def main() -> None:
    global mask_s
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    llm = LLM("smollm2-135m")
    tok = llm.tokenizer

    def prompt(city: str) -> list[int]:
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"Describe {city} as JSON."}], add_generation_prompt=True
        )
        return tok.encode(text, add_special_tokens=False)

    free = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    constrained = SamplingParams(temperature=0.0, max_tokens=args.max_tokens,
                                 structured=StructuredOutput.json_schema(SCHEMA))  # fmt: skip
    run(llm, [prompt("Rome")] * 2, constrained)  # warm-up: the grammar index, first steps
    print(f"{'batch':>5} {'free ms/step':>12} {'json ms/step':>12} {'ratio':>6} "
          f"{'mask ms/step':>12} {'parsed':>7}")  # fmt: skip
    for b in [int(x) for x in args.batch.split(",")]:
        prompts = [prompt(CITIES[i % len(CITIES)]) for i in range(b)]
        free_s, json_s, masks, parsed, total = [], [], [], 0, 0
        for _ in range(args.rounds):
            step_s, _, _ = run(llm, prompts, free)
            free_s.append(step_s)
            mask_s = 0.0
            step_s, steps, texts = run(llm, prompts, constrained)
            json_s.append(step_s)
            masks.append(mask_s / steps)
            for t in texts:
                total += 1
                try:
                    json.loads(t)
                    parsed += 1
                except ValueError:
                    pass  # cut by max_tokens
        f, j = statistics.median(free_s), statistics.median(json_s)
        mask_ms = statistics.median(masks) * 1e3
        print(f"{b:>5} {f * 1e3:>12.1f} {j * 1e3:>12.1f} {j / f:>5.2f}x "
              f"{mask_ms:>12.2f} {parsed:>3}/{total}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
