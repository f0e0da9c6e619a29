"""Engine step time of two source trees (e.g. before and after a refactor), interleaved.

    python benchmarks/bench_tree_ab.py --against /path/to/other/checkout [--requests 64]
        [--rounds 12] [--steps 40] [--context 100] [--quantization auto]
    python benchmarks/bench_tree_ab.py --against ... --prefill 1024 [--rounds 8] [--steps 3]

Two worker processes, one importing `surge` from this checkout and one from `--against`, each
load the model and decode `--requests` requests of `--context` prompt tokens. The driver then
alternates: it asks one worker for `--steps` engine steps, then the other, for `--rounds` rounds;
only one worker runs at a time, so both see the same machine and the drift between minutes
falls on both alike. Each round's figure is the median step time of its steps. The workers use
only `LLM`, `engine.add_request` and `engine.step`, which every tree since the engine began has.

--prefill N: instead of decode steps, the time from adding a fresh N-token prompt (a distinct
start: no prefix-cache hit) to its first token, in the engine's own steps; `--steps` prompts a
round, the median of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, statistics, sys, time
from surge import LLM, SamplingParams
try:
    from surge.engine.client.outputs import EngineCoreRequest
except ImportError:  # a tree from before the engine's split into four parts
    from surge.engine.outputs import EngineCoreRequest
args = json.loads(sys.argv[1])
llm = LLM(args["model"], quantization=args["quantization"], max_num_seqs=max(args["requests"], 4))
text = "Large language models are served to many users at once by batching requests. " * (
    1 + max(args["context"], args["prefill"]) // 12)
if args["prefill"]:
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    k = 0
    def first_token():
        global k
        k += 1
        ids = llm.tokenizer.encode(f"prompt {k}: {text}")[: args["prefill"]]
        t = time.perf_counter()
        llm.engine.add_request(EngineCoreRequest(f"p{k}", ids, one))
        while llm.engine.has_work():
            llm.engine.step()
        return time.perf_counter() - t
    first_token()  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        times = [first_token() for _ in range(int(line))]
        print(json.dumps({"median_ms": statistics.median(times) * 1e3}), flush=True)
    sys.exit(0)
params = SamplingParams(temperature=0.0, max_tokens=1_000_000, ignore_eos=True)
for i in range(args["requests"]):
    ids = llm.tokenizer.encode(f"{i}: {text}")[: args["context"]]
    llm.engine.add_request(EngineCoreRequest(str(i), ids, params))
sched = llm.engine.scheduler
while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
    llm.engine.step()
for _ in range(4):
    llm.engine.step()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        t = time.perf_counter()
        llm.engine.step()
        times.append(time.perf_counter() - t)
    print(json.dumps({"median_ms": statistics.median(times) * 1e3}), flush=True)
"""


def start(tree: Path, args: argparse.Namespace) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    keys = ("model", "quantization", "requests", "context", "prefill")
    spec = {k: getattr(args, k) for k in keys}
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, json.dumps(spec)],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    if json.loads(proc.stdout.readline()).get("ready") is not True:
        raise SystemExit(f"worker for {tree} did not start")
    return proc


def ask(proc: subprocess.Popen, steps: int) -> float:
    proc.stdin.write(f"{steps}\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())["median_ms"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", type=Path, required=True, help="the other checkout's root")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--quantization", default="auto")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--prefill", type=int, default=0, help="time N-token prefills instead")
    args = ap.parse_args()
    trees = {"this": Path(__file__).resolve().parents[1], "against": args.against.resolve()}
    # One at a time: a worker's load (and kernel build) must not overlap the other's.
    workers = {name: start(tree, args) for name, tree in trees.items()}
    rounds: dict[str, list[float]] = {name: [] for name in trees}
    try:
        for i in range(args.rounds):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))  # neither always first
            for name in order:
                rounds[name].append(ask(workers[name], args.steps))
    finally:
        for proc in workers.values():
            proc.stdin.close()
            proc.wait(timeout=60)
    if args.prefill:
        what = f"{args.prefill}-token prefill to the first token"
        print(f"{what}, {args.quantization}, ms per round:")
    else:
        print(f"{args.requests} requests, {args.quantization}, median ms a step per round:")
    for name, ms in rounds.items():
        tok_s = (args.prefill or args.requests) * 1000 / statistics.median(ms)
        print(
            f"  {name:8s} {trees[name]}: "
            + " ".join(f"{x:.2f}" for x in ms)
            + f"  -> median {statistics.median(ms):.2f} ms, {tok_s:.1f} tok/s"
        )
    wins = sum(a < b for a, b in zip(rounds["this"], rounds["against"], strict=True))
    ratio = statistics.median(rounds["against"]) / statistics.median(rounds["this"])
    what = "time" if args.prefill else "step-time"
    print(f"this tree faster in {wins}/{args.rounds} rounds; {what} ratio against/this {ratio:.3f}")


if __name__ == "__main__":
    main()
