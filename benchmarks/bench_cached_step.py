"""The engine step of a prefix-cache hit: a 1,024-token prompt computed once, then the same prompt
with N new tokens after it, whose step computes only those N rows against the 1,024 cached keys;
with tiled prefill attention and a row at a time, alternating, in one process.

    python benchmarks/bench_cached_step.py [--new 1,2,4,8,12,16,24,32] [--rounds 8] [--prefix 1024]

Prints, per N and attention kind, the median step time and the stack's attention phases (the
packing of the keys and values for the tiles included). Needs the fused stack with tiled
prefill (AVX-512 BF16, a bf16 KV cache); SmolLM2, default q4.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from surge import LLM, SamplingParams
from surge.engine.client.outputs import EngineCoreRequest
from surge.engine.core.engine_core import EngineCore
from surge.engine.runner.step_paths import FusedStackPath

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
ONE = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def run(eng: EngineCore, req_id: str, prompt: list[int]) -> float:
    """Seconds of engine steps to the request's one token."""
    eng.add_request(EngineCoreRequest(req_id, prompt, ONE))
    took = 0.0
    while eng.scheduler.waiting or eng.scheduler.running:
        t = time.perf_counter()
        eng.step()
        took += time.perf_counter() - t
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1, 2, 4, 8, 12, 16, 24, 32])  # fmt: skip
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=1024, help="a multiple of the block size")
    args = ap.parse_args()
    llm = LLM("smollm2-135m", max_num_seqs=4)
    eng = llm.engine
    path = next((p for p in eng.runner.paths if isinstance(p, FusedStackPath)), None)
    if path is None or not path.fused.stack.tiled_prefill:
        raise SystemExit("no tiled prefill here: needs the fused stack, AVX-512 BF16, bf16 cache")
    stack = path.fused.stack
    chapter = llm.tokenizer.encode((DATA / "pride_and_prejudice_ch1.txt").read_text())
    needed = 53 * (2 * len(args.new) * (args.rounds + 1) + 2) + args.prefix + 4000
    ids = chapter * (1 + needed // len(chapter))
    took: dict[tuple[int, bool], list[float]] = {}
    attn: dict[tuple[int, bool], list[float]] = {}
    n = 0
    for rnd in range(args.rounds + 1):  # round 0 warms up
        for new in args.new:
            for tiles in (True, False) if rnd % 2 else (False, True):
                n += 1
                prefix = ids[n * 53 : n * 53 + args.prefix]  # fresh: no hit from an earlier round
                run(eng, f"p{n}", prefix)
                path.tiled_prefill = tiles
                stack.phase_seconds()  # reset
                dt = run(eng, f"c{n}", prefix + ids[-new:])
                phases = dict(stack.phase_seconds())
                path.tiled_prefill = True
                if rnd:
                    took.setdefault((new, tiles), []).append(dt * 1e3)
                    ms = (phases["attention"] + phases["attention_pack"]) * 1e3
                    attn.setdefault((new, tiles), []).append(ms)
    print(f"cached step: {args.prefix}-token prefix cached, N new rows; median ms of "
          f"{args.rounds} rounds (attention with packing in brackets)")  # fmt: skip
    for new in args.new:
        t, r = statistics.median(took[(new, True)]), statistics.median(took[(new, False)])
        at, ar = statistics.median(attn[(new, True)]), statistics.median(attn[(new, False)])
        print(f"  N={new:3d}: tiles {t:6.2f} ({at:5.2f})  rows {r:6.2f} ({ar:5.2f})  "
              f"rows/tiles {r / t:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
