"""The fused stack's prefill attention: tiles (kernels/prefill_attention.h) against one row at a
time, in one process, alternating; and, with --accuracy, what the tiles' bf16 probabilities do
to greedy answers on long prompts.

    python benchmarks/bench_prefill_attention.py [--lengths 128,1024,4096] [--rounds 4]
        [--accuracy --prompts 32 --prompt-len 1024 --tokens 32]

Speed: each round prefills a fresh prompt of each length (no prefix-cache hit; the engine's
default 512-token steps) once with tiles and once a row at a time (the order flipped each
round), and reports the median prefill time and the stack's attention phase per prompt.
Accuracy: `--prompts` prompts of `--prompt-len` tokens (Pride and Prejudice, chapter 1,
repeated, at different offsets) answered greedily for `--tokens` tokens by the default q4
engine with tiles, without, and by float32 weights (no quantization, the reference):
identical answers, the mean length of the common prefix, and tiles against rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from surge import LLM, SamplingParams
from surge.engine.client.outputs import EngineCoreRequest
from surge.engine.runner.step_paths import FusedStackPath

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def fused_path(llm: LLM) -> FusedStackPath:
    path = next((p for p in llm.engine.runner.paths if isinstance(p, FusedStackPath)), None)
    if path is None or not path.fused.stack.tiled_prefill:
        raise SystemExit("no tiled prefill here: needs the fused stack, AVX-512 BF16, bf16 cache")
    return path


def run_all(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(EngineCoreRequest(str(i), p, params))
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while eng.scheduler.waiting or eng.scheduler.running:
        for o in eng.step():
            out[o.req_id].extend(o.new_token_ids)
    return [out[str(i)] for i in range(len(prompts))]


def speed(args: argparse.Namespace) -> None:
    # No prefix caching: the text repeats (a 572-token chapter), and a hit would skip work.
    llm = LLM("smollm2-135m", max_num_seqs=4, enable_prefix_caching=False)
    path = fused_path(llm)
    stack = path.fused.stack
    chapter = llm.tokenizer.encode((DATA / "pride_and_prejudice_ch1.txt").read_text())
    needed = 131 * 2 * (args.rounds + 1) * len(args.lengths) + max(args.lengths)
    ids = chapter * (1 + needed // len(chapter))
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    took: dict[tuple[int, bool], list[float]] = {}
    attn: dict[tuple[int, bool], list[float]] = {}
    n = 0
    for rnd in range(args.rounds + 1):  # round 0 warms up (the pool's first page touches)
        for length in args.lengths:
            for tiles in (True, False) if rnd % 2 else (False, True):
                n += 1
                prompt = ids[n * 131 : n * 131 + length]  # a fresh prefix: no cache hit
                path.tiled_prefill = tiles
                stack.phase_seconds()
                t = time.perf_counter()
                run_all(llm, [prompt], one)
                dt = time.perf_counter() - t
                if rnd:
                    took.setdefault((length, tiles), []).append(dt * 1e3)
                    phases = dict(stack.phase_seconds())
                    attn.setdefault((length, tiles), []).append(phases["attention"] * 1e3)
    print("prefill of one prompt, median ms (the stack's attention phase in brackets):")
    for length in args.lengths:
        t, r = statistics.median(took[(length, True)]), statistics.median(took[(length, False)])
        at, ar = statistics.median(attn[(length, True)]), statistics.median(attn[(length, False)])
        print(f"  {length:5d} tokens: tiles {t:8.1f} ({at:7.1f})  rows {r:8.1f} ({ar:7.1f})  "
              f"rows/tiles {r / t:.2f}x, attention {ar / at:.2f}x")  # fmt: skip


def accuracy(args: argparse.Namespace) -> None:
    text = (DATA / "pride_and_prejudice_ch1.txt").read_text()
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    answers: dict[str, list[list[int]]] = {}
    for name in ("float32", "tiles", "rows"):
        reference = {"quantization": "none", "dtype": "float32"} if name == "float32" else {}
        llm = LLM("smollm2-135m", max_num_seqs=args.prompts, **reference)
        chapter = llm.tokenizer.encode(text)  # 572 tokens, repeated to the prompts' length
        ids = chapter * (2 + (97 * args.prompts + args.prompt_len) // len(chapter))
        prompts = [ids[i * 97 : i * 97 + args.prompt_len] for i in range(args.prompts)]
        if name != "float32":
            fused_path(llm).tiled_prefill = name == "tiles"
        answers[name] = run_all(llm, prompts, params)
        del llm

    def compare(a: list[list[int]], b: list[list[int]]) -> str:
        same = sum(x == y for x, y in zip(a, b, strict=True))
        prefix = [next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))
                  for x, y in zip(a, b, strict=True)]  # fmt: skip
        return f"{same}/{len(a)} identical, common prefix {statistics.mean(prefix):.1f} tokens"

    ref = answers["float32"]
    print(f"{args.prompts} prompts of {args.prompt_len} tokens, {args.tokens} greedy tokens:")
    print(f"  tiles against float32: {compare(answers['tiles'], ref)}")
    print(f"  rows  against float32: {compare(answers['rows'], ref)}")
    print(f"  tiles against rows:    {compare(answers['tiles'], answers['rows'])}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")],
                    default=[128, 1024, 4096])  # fmt: skip
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    if args.accuracy:
        accuracy(args)
    else:
        speed(args)


if __name__ == "__main__":
    main()
