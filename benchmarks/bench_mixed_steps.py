"""Steps that mix decodes with a new prompt's prefill chunk, with the fused 4-bit stack taking the
chunk as rows of its own (new) or leaving the step to the layer-by-layer path (old), alternating
in one process so that a drifting machine moves both alike.

    python benchmarks/bench_mixed_steps.py --decodes 63 --chunk 32 [--rounds 6] [--dtype auto]
    python benchmarks/bench_mixed_steps.py --long 2048 [--rounds 2]   # one prompt, 512-token chunks
    python benchmarks/bench_mixed_steps.py --steady 64 --chunk 32 --output 128 [--seconds 20]

Needs a CPU with the kernels (AVX2 or AVX-512 VNNI): --quantization q4's fused stack.
"""

from __future__ import annotations

import argparse
import statistics
import time

from surge import LLM, SamplingParams
from surge.engine.core import EngineCore
from surge.engine.outputs import EngineCoreRequest

TEXT = "Large language models are served to many users at once by batching requests. " * 400
ONE = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)


def mixed_steps(llm: LLM, decodes: int, chunk: int, rounds: int) -> None:
    eng = llm.engine
    new_max = _stack(eng).max_chunk
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
    for rnd in range(rounds):
        for name in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
            _stack(eng).max_chunk = 0 if name == "old" else new_max
            times = []
            for _ in range(4):
                eng.step()  # a pure decode step between mixed ones
                k += 1
                eng.add_request(EngineCoreRequest(f"n{k}", _prompt(llm, k, chunk), ONE))
                t0 = time.perf_counter()
                eng.step()
                times.append(time.perf_counter() - t0)
            res[name].append(statistics.median(times) * 1e3)
    _stack(eng).max_chunk = new_max
    for name, v in res.items():
        print(f"{name}: median mixed step {statistics.median(v):.1f} ms, rounds {_r(v)}")
    faster = sum(a < b for a, b in zip(res["new"], res["old"], strict=True))
    ratio = statistics.median(res["new"]) / statistics.median(res["old"])
    print(f"{decodes} decodes + {chunk}-token chunk: new/old {ratio:.3f}, new faster in "
          f"{faster} of {rounds}")  # fmt: skip


def long_prompt(llm: LLM, length: int, rounds: int) -> None:
    eng = llm.engine
    new_max = _stack(eng).max_chunk
    res: dict[str, list[list[float]]] = {"old": [], "new": []}
    for rnd in range(rounds):
        for name in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
            _stack(eng).max_chunk = 0 if name == "old" else new_max
            eng.add_request(EngineCoreRequest(f"{name}{rnd}", _prompt(llm, rnd, length), ONE))
            times = []
            while eng.has_work():
                t0 = time.perf_counter()
                eng.step()
                times.append(time.perf_counter() - t0)
            res[name].append(times)
    _stack(eng).max_chunk = new_max
    for name, runs in res.items():
        per_chunk = [statistics.median(c) * 1e3 for c in zip(*runs, strict=True)]
        print(f"{name}: ms per chunk step {_r(per_chunk)}, total {sum(per_chunk):.0f}")


def steady(llm: LLM, streams: int, prompt: int, output: int, seconds: float, rounds: int) -> None:
    """`streams` requests always in flight, each `prompt` tokens in and `output` out, a new one
    added as each finishes (their ends staggered from the start): the steady state of a busy
    server, where a step often carries a new prompt. Output tok/s per round."""
    eng = llm.engine
    new_max = _stack(eng).max_chunk
    k = 0

    def add(max_tokens: int) -> None:
        nonlocal k
        k += 1
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        eng.add_request(EngineCoreRequest(f"s{k}", _prompt(llm, k, prompt), params))

    for i in range(streams):  # staggered: one finishes every output / streams steps
        add(1 + (i * output) // streams)
    res: dict[str, list[float]] = {"old": [], "new": []}
    for rnd in range(rounds + 1):
        for name in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
            _stack(eng).max_chunk = 0 if name == "old" else new_max
            tokens = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                for out in eng.step():
                    tokens += len(out.new_token_ids)
                    if out.finish_reason is not None:
                        add(output)
            if rnd > 0:  # the first round settles the staggering: not counted
                res[name].append(tokens / (time.perf_counter() - t0))
    _stack(eng).max_chunk = new_max
    for name, v in res.items():
        print(f"{name}: output tok/s {statistics.median(v):.1f}, rounds {_r(v)}")
    faster = sum(a > b for a, b in zip(res["new"], res["old"], strict=True))
    ratio = statistics.median(res["new"]) / statistics.median(res["old"])
    print(f"{streams} streams, {prompt} in / {output} out: new/old {ratio:.3f}, new faster in "
          f"{faster} of {rounds}")  # fmt: skip


def _stack(eng: EngineCore):  # type: ignore[no-untyped-def]
    if eng.runner.fused is None:
        raise SystemExit("no fused 4-bit stack here (needs q4 and the CPU kernels)")
    return eng.runner.fused


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
        steady(llm, args.steady, args.chunk, args.output, args.seconds, args.rounds)
    elif args.long:
        long_prompt(llm, args.long, args.rounds)
    else:
        mixed_steps(llm, args.decodes, args.chunk, args.rounds)


if __name__ == "__main__":
    main()
