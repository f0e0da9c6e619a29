"""Decode step time of several configurations, interleaved in one process so that this
machine's drift between runs falls on all of them alike.

    python benchmarks/bench_decode_ab.py [--configs int8+compile,q4+compile] [--requests 1]
        [--rounds 6] [--steps 40] [--context 100] [--layout sequential]

A configuration is a quantization with optional suffixes: "+compile" (torch.compile, only the
graph for this batch size is built), "+layers" (no fused decode stack: layer by layer), "+kvbf16",
"+kvf32" and "+kvint8" (a bfloat16, float32 or int8 KV cache whatever `auto` would choose), "+bi"
(--batch-invariant).
Each decodes `requests` requests of `--context` prompt tokens (100) at once; rounds alternate
between the configurations, each round the median of `steps` engine steps. `--layout scattered`
shuffles each engine's free blocks first, so a request's blocks lie anywhere in the pool, as in
a server after churn and prefix-cache reuse (a fresh pool hands them out in order). Also printed:
how long each configuration's prefills took, which includes the first writes to its KV pool's
pages (huge pages, built as they are first touched).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import OrderedDict

from surge import LLM, SamplingParams
from surge.engine.client.outputs import EngineCoreRequest


def build(config: str, requests: int) -> LLM:
    quantization, *flags = config.split("+")
    kv_flags = {"kvbf16": "bfloat16", "kvf32": "float32", "kvint8": "int8"}
    unknown = set(flags) - {"compile", "layers", "bi", *kv_flags}
    if unknown:
        raise SystemExit(f"unknown flags {unknown} in {config!r}")
    return LLM(
        "smollm2-135m",
        quantization=quantization,
        compile="compile" in flags,
        compile_warmup=False,
        fused_decode="layers" not in flags,
        batch_invariant="bi" in flags,
        kv_cache_dtype=next((kv_flags[f] for f in flags if f in kv_flags), "auto"),
        max_num_seqs=max(requests, 4),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="int8+compile,q4+compile")
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--context", type=int, default=100, help="prompt tokens a request")
    ap.add_argument("--layout", default="sequential", choices=["sequential", "scattered"])
    args = ap.parse_args()
    llms = {c: build(c, args.requests) for c in args.configs.split(",")}
    if args.layout == "scattered":
        for llm in llms.values():
            blocks = llm.engine.blocks
            order = list(blocks._free)  # all free: nothing has run yet
            random.Random(0).shuffle(order)
            blocks._free = OrderedDict.fromkeys(order)
    text = "Large language models are served to many users at once by batching requests. " * (
        1 + args.context // 12
    )
    params = SamplingParams(temperature=0.0, max_tokens=1_000_000, ignore_eos=True)
    prefill_s: dict[str, float] = {}
    for name, llm in llms.items():
        t = time.perf_counter()
        for i in range(args.requests):
            ids = llm.tokenizer.encode(f"{i}: {text}")[: args.context]
            llm.engine.add_request(EngineCoreRequest(str(i), ids, params))
        sched = llm.engine.scheduler
        while sched.waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in sched.running
        ):
            llm.engine.step()  # the prefills
        prefill_s[name] = time.perf_counter() - t
        for _ in range(4):  # the first decodes (and the compile)
            llm.engine.step()
    rounds: dict[str, list[float]] = {name: [] for name in llms}
    for _ in range(args.rounds):
        for name, llm in llms.items():
            times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                llm.engine.step()
                times.append(time.perf_counter() - t)
            rounds[name].append(statistics.median(times) * 1e3)
    print(f"{args.requests} requests, {args.layout} blocks, median ms a step per round:")
    for name, ms in rounds.items():
        per_round = " ".join(f"{x:.2f}" for x in ms)
        tok_s = args.requests * 1000 / statistics.median(ms)
        print(f"  {name:18s} {per_round}  -> {tok_s:.1f} tok/s (prefills {prefill_s[name]:.2f} s)")


if __name__ == "__main__":
    main()
