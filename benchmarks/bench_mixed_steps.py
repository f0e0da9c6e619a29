"""Steps that mix decodes with a new prompt's prefill chunk, with the fused 4-bit stack taking the
chunk as rows of its own (new) or leaving the step to the layer-by-layer path (old), alternating
in one process so that a drifting machine moves both alike.

    python benchmarks/bench_mixed_steps.py --decodes 63 --chunk 32 [--rounds 6] [--dtype auto]
    python benchmarks/bench_mixed_steps.py --long 2048 [--rounds 2]   # one prompt, 512-token chunks
    python benchmarks/bench_mixed_steps.py --steady 64 --chunk 32 --output 128 [--seconds 20]

--max-chunk N: the longest chunk the stack takes on the "new" side (default: its own limit), to
measure a limit before changing it.

Needs a CPU with the kernels (AVX2 or AVX-512 VNNI): --quantization q4's fused stack.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator

from surge import LLM, SamplingParams
from surge.engine.client.outputs import EngineCoreRequest
from surge.engine.core.engine_core import EngineCore

TEXT = "Large language models are served to many users at once by batching requests. " * 400
ONE = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def mixed_steps(llm: LLM, decodes: int, chunk: int, rounds: int, max_chunk: int | None) -> None:
    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True)
    for i in range(decodes):
        ids = llm.tokenizer.encode(f"{i}: {TEXT}")[:100]
        eng.add_request(EngineCoreRequest(f"d{i}", ids, params))
    while eng.scheduler.num_waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running
    ):
        eng.step()
    res: dict[str, list[float]] = {"old": [], "new": []}
    k = 0
    for _, name in _alternating(eng, rounds, max_chunk):
        times = []
        for _ in range(4):
            eng.step()  # a pure decode step between mixed ones
            k += 1
            eng.add_request(EngineCoreRequest(f"n{k}", _prompt(llm, k, chunk), ONE))
            t0 = time.perf_counter()
            eng.step()
            times.append(time.perf_counter() - t0)
        res[name].append(statistics.median(times) * 1e3)
    _summary(
        res, "median mixed step", " ms", f"{decodes} decodes + {chunk}-token chunk", lower=True
    )


def long_prompt(llm: LLM, length: int, rounds: int, max_chunk: int | None) -> None:
    eng = llm.engine
    res: dict[str, list[list[float]]] = {"old": [], "new": []}
    for rnd, name in _alternating(eng, rounds, max_chunk):
        eng.add_request(EngineCoreRequest(f"{name}{rnd}", _prompt(llm, rnd, length), ONE))
        times = []
        while eng.has_work():
            t0 = time.perf_counter()
            eng.step()
            times.append(time.perf_counter() - t0)
        res[name].append(times)
    for name, runs in res.items():
        per_chunk = [statistics.median(c) * 1e3 for c in zip(*runs, strict=True)]
        print(f"{name}: ms per chunk step {_r(per_chunk)}, total {sum(per_chunk):.0f}")


def steady(
    llm: LLM, streams: int, prompt: int, output: int, seconds: float, rounds: int,
    max_chunk: int | None,
) -> None:  # fmt: skip
    """`streams` requests always in flight, each `prompt` tokens in and `output` out, a new one
    added as each finishes (their ends staggered from the start): the steady state of a busy
    server, where a step often carries a new prompt. Output tok/s per round."""
    eng = llm.engine
    k = 0

    def add(max_tokens: int) -> None:
        nonlocal k
        k += 1
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        eng.add_request(EngineCoreRequest(f"s{k}", _prompt(llm, k, prompt), params))

    for i in range(streams):  # staggered: one finishes every output / streams steps
        add(1 + (i * output) // streams)
    res: dict[str, list[float]] = {"old": [], "new": []}
    for rnd, name in _alternating(eng, rounds + 1, max_chunk):
        tokens = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for out in eng.step():
                tokens += len(out.new_token_ids)
                if out.finish_reason is not None:
                    add(output)
        if rnd > 0:  # the first round settles the staggering: not counted
            res[name].append(tokens / (time.perf_counter() - t0))
    label = f"{streams} streams, {prompt} in / {output} out"
    _summary(res, "output tok/s", "", label, lower=False)


def _alternating(eng: EngineCore, rounds: int, max_chunk: int | None) -> Iterator[tuple[int, str]]:
    """(round, "old" | "new") in alternating order, the stack's chunk limit set for each: 0
    (chunks leave the step to the layer-by-layer path) or `max_chunk` (default: its own);
    restored after."""
    stack = eng.runner.fused
    if stack is None:
        raise SystemExit("no fused 4-bit stack here (needs q4 and the CPU kernels)")
    own = stack.max_chunk
    try:
        for rnd in range(rounds):
            for name in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
                stack.max_chunk = 0 if name == "old" else (max_chunk or own)
                yield rnd, name
    finally:
        stack.max_chunk = own


def _summary(res: dict[str, list[float]], what: str, unit: str, label: str, lower: bool) -> None:
    for name, v in res.items():
        print(f"{name}: {what} {statistics.median(v):.1f}{unit}, rounds {_r(v)}")
    pairs = zip(res["new"], res["old"], strict=True)
    faster = sum((a < b) if lower else (a > b) for a, b in pairs)
    ratio = statistics.median(res["new"]) / statistics.median(res["old"])
    print(f"{label}: new/old {ratio:.3f}, new faster in {faster} of {len(res['new'])}")


def _prompt(llm: LLM, k: int, length: int) -> list[int]:
    # A distinct start per prompt: no prefix-cache hit between them.
    return llm.tokenizer.encode(f"new {k}: {TEXT}")[:length]


def _r(values: list[float]) -> list[float]:
    return [round(v, 1) for v in values]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decodes", type=int, default=63)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--long", type=int, default=0, help="one prompt of this many tokens instead")
    ap.add_argument("--steady", type=int, default=0, help="this many streams, steady state")
    ap.add_argument("--output", type=int, default=128, help="--steady: tokens out per request")
    ap.add_argument("--seconds", type=float, default=20.0, help="--steady: per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-chunk", type=int, default=None, help="the new side's chunk limit")
    args = ap.parse_args()
    budget = max(512, args.decodes + args.chunk) if not args.long else 512
    llm = LLM(
        "smollm2-135m",
        dtype=args.dtype,
        quantization="q4",
        max_num_seqs=max(args.decodes + 1, args.steady),
        max_num_batched_tokens=budget,
        enable_prefix_caching=not args.long,
    )
    if args.steady:
        steady(llm, args.steady, args.chunk, args.output, args.seconds, args.rounds, args.max_chunk)
    elif args.long:
        long_prompt(llm, args.long, args.rounds, args.max_chunk)
    else:
        mixed_steps(llm, args.decodes, args.chunk, args.rounds, args.max_chunk)


if __name__ == "__main__":
    main()
