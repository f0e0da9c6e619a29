"""Decode speed in process, one stream and a 16-request step, of GGUF files: with a source tree
against another (a copy of the tree before a change), runs alternating, one process each.

    python benchmarks/bench_fused_gguf.py FILE.gguf [FILE.gguf ...] \
        [--tree /path/to/old/checkout --tree .] [--layers] [--rounds 3] [--tokens 64]

Each run loads the file (auto quantization), then times greedy generation of --tokens tokens
and of 1 token after a 100-token prompt, at 1 and at 16 requests: decode tok/s and the step
time are (tokens - 1) steps over the difference (the prompt's prefill cancels out). It says
which path decodes ("fused stack" or "layer by layer") and the layers' types. Each tree runs
with PYTHONPATH set to it, so its own surge (and its own compiled kernels, built on first use
in a folder of their own) serves; trees alternate within each round. --layers also runs each
tree with the fused stack off (fused_decode=False: layer by layer). Figures move with
whatever else the machine runs: compare one tree against the other within a round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = list(range(100, 200))


def measure(model: str, tokens: int, fused: bool) -> dict[str, object]:
    """One run in this process: load, warm up, then the 1- and 16-request timings."""
    from surge.engine.llm import LLM
    from surge.sampling_params import SamplingParams

    t0 = time.perf_counter()
    llm = LLM(model, num_blocks=256, fused_decode=fused)
    load_s = time.perf_counter() - t0
    runner = llm.engine.runner
    path = "fused stack" if getattr(runner, "fused", None) is not None else "layer by layer"
    kinds: dict[str, int] = {}
    for module in llm.engine.model.modules():
        name = type(module).__name__
        if name.endswith(("Linear", "Segments")):
            kinds[name] = kinds.get(name, 0) + 1

    def timed(requests: int, n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        t = time.perf_counter()
        llm.generate([PROMPT] * requests, params, use_tqdm=False)  # type: ignore[arg-type]
        return time.perf_counter() - t

    out: dict[str, object] = {"path": path, "layers": kinds, "load_s": round(load_s, 1)}
    for requests in (1, 16):
        timed(requests, 4)  # warm-up
        step = min((timed(requests, tokens) - timed(requests, 1)) / (tokens - 1) for _ in range(2))
        out[f"{requests}_step_ms"] = round(step * 1e3, 2)
        out[f"{requests}_tok_s"] = round(requests / step, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--tree", action="append", help="a source tree (default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--layers", action="store_true", help="also with the stack off")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child run
    parser.add_argument("--off", action="store_true", help=argparse.SUPPRESS)  # stack off
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.models[0], args.tokens, not args.off)))
        return
    here = Path(__file__).resolve().parents[1]
    trees = [str(Path(t).resolve()) for t in (args.tree or [str(here)])]
    runs = [(tree, off) for tree in trees for off in ((False, True) if args.layers else (False,))]
    results: dict[tuple[str, str], list[dict[str, object]]] = {}
    for r in range(args.rounds):
        for model in args.models:
            for tree, off in runs:
                env = {**os.environ, "PYTHONPATH": tree}
                cmd = [sys.executable, __file__, model, "--one", "--tokens", str(args.tokens)]
                done = subprocess.run(
                    cmd + (["--off"] if off else []), env=env, capture_output=True, text=True
                )
                if done.returncode:
                    sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
                res = json.loads(done.stdout.strip().splitlines()[-1])
                label = tree + (" (stack off)" if off else "")
                results.setdefault((model, label), []).append(res)
                print(f"round {r + 1} {Path(model).name} {label}: {res}", flush=True)
    print("\nmedian over rounds:")
    for (model, tree), runs in results.items():
        cols = {k: statistics.median(float(x[k]) for x in runs) for k in runs[0] if "_" in k}  # type: ignore[arg-type]
        print(f"{Path(model).name:28s} {tree}: {runs[0]['path']}, {cols}")


if __name__ == "__main__":
    main()
