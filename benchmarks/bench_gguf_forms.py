"""One stream, in process: a GGUF's decode speed, load time and peak RSS with its K-quant
matrices in one form or another (forms.FORM_BY_TYPE), one form per process.

    python benchmarks/bench_gguf_forms.py FILE.gguf --form blocks   # the file's own blocks
    python benchmarks/bench_gguf_forms.py FILE.gguf --form int8     # K-quants as int8

Tokens/s counts 64 greedy tokens after a 100-token prompt (prefill included), best of 3.
Run both forms on the same file, one after the other, on a quiet machine; compare their ratio.
"""

from __future__ import annotations

import argparse
import resource
import time

import surge.models.forms as forms
from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams

K_TYPES = ("Q4_K", "Q5_K", "Q6_K")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--form", choices=("blocks", "int8"), default="blocks")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    for t in K_TYPES:
        forms.FORM_BY_TYPE[t] = args.form
    t0 = time.perf_counter()
    llm = LLM(args.model, num_blocks=64)
    load_s = time.perf_counter() - t0
    prompt = [list(range(100, 200))]
    warm = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate(prompt, warm, use_tqdm=False)  # type: ignore[arg-type]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        llm.generate(prompt, params, use_tqdm=False)  # type: ignore[arg-type]
        best = max(best, args.tokens / (time.perf_counter() - t))
    counts: dict[str, int] = {}
    for module in llm.engine.model.modules():
        name = type(module).__name__
        if name.endswith("Linear"):
            counts[name] = counts.get(name, 0) + 1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"{args.form}: load {load_s:.1f} s, one stream {best:.1f} tok/s, peak RSS {peak:.0f} MiB, "
        f"layers {counts}"
    )


if __name__ == "__main__":
    main()
