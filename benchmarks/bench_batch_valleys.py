"""Batch work in the valleys (issue #46, targets 3 and 4): what a running batch costs interactive
users, how much of the room they leave it takes, and how fast a batch runs alone.

One `surge serve` (SmolLM2 by default), every phase in the same run, the same request shape
(--input-len prompt tokens, --output-len output tokens, ignore_eos) for interactive requests and
batch lines:

1. Capacity: a closed loop of --capacity-clients streams for --capacity-duration seconds. The
   engine's measured capacity C is the output tokens/s of that loop (the engine saturated by
   these requests); the engine's own counter (vllm:generation_tokens_total) over the same
   seconds is printed beside it as a check.
2. Baseline: a sinusoidal interactive load (open loop, Poisson, rate from --base to --peak of
   the capacity's requests/s, one period per run) for --duration seconds: TTFT p99, interactive
   output tokens/s I0.
3. With a batch: a batch of --batch-lines lines is submitted, then the same load (same seed):
   TTFT p99 and interactive tokens/s I1; the batch's tokens/s B = surge:batch_tokens_total's
   growth over the same seconds. Batch share of the leftover capacity = B / (C - I1).
   Targets: TTFT p99 with the batch <= 1.10 x without it; share >= 0.80.
   `server_side` splits each run's interactive TTFT as the server saw it (means: before the
   engine, in the engine's queue, whole) and gives the API and engine processes' CPU (cores).
4. (--throughput-lines N) A batch of N lines alone, against a closed loop of the same N requests
   at --batch-max-concurrency streams: target >= 0.90 of its tokens/s.

    python -m benchmarks.bench_batch_valleys [--model smollm2-135m] [--duration 120]
        [--batch-lines 5000] [--throughput-lines 10000] [--no-valleys] [--json out.json]

Check run (not a measurement): --model <tiny folder> --duration 6 --capacity-duration 4
    --batch-lines 40 --throughput-lines 20 --input-len 16 --output-len 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from surge.bench.config import ArrivalConfig, BenchConfig, LengthDist, WorkloadConfig
from surge.bench.drive import run
from surge.bench.metrics import Report, summarize
from surge.bench.workload import prompts
from surge.models.formats.resolve import resolve_model
from tests.servers import ServerProcess


def workload(args: argparse.Namespace, path: str | None) -> WorkloadConfig:
    """The request shape; `path`: a tokenizer.json for exact prompt lengths (None: words)."""
    return WorkloadConfig(
        input_len=LengthDist("fixed", args.input_len),
        output_len=LengthDist("fixed", args.output_len),
        tokenizer_path=path,
    )


def bench(url: str, args: argparse.Namespace, path: str | None, **kw: Any) -> Report:
    config = BenchConfig(url, "test-model", workload=workload(args, path), seed=args.seed, **kw)
    result = asyncio.run(run(config))
    return summarize(result.records, duration_s=result.duration_s)


def metric(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


# Server-side sums and counts (interactive requests only: batch lines stay out of these), to
# say where a phase's TTFT went: before the engine (the API process), waiting in the engine's
# queue (the step in flight and the steps before its first), or after.
SPLITS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "engine_queue": "vllm:request_queue_time_seconds",
    "api_before_engine": "surge:request_overhead_seconds",
}


def sums(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    want = {f"{m}_{k}": f"{n}_{k}" for n, m in SPLITS.items() for k in ("sum", "count")}
    out = dict.fromkeys(want.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in want:  # one model: its model_name label only
                out[want[sample.name]] += float(sample.value)
    return out


class Phase:
    """What one phase cost: the server's interactive TTFT split (means, seconds) and the CPU
    seconds of the API process and of the engine process (2 cores share both)."""

    def __init__(self, server: ServerProcess) -> None:
        import psutil

        self.server = server
        self.procs = {
            "api": psutil.Process(server.proc.pid),
            "engine": psutil.Process(server.engine_pid()),
        }
        self.t0, self.s0, self.c0 = time.monotonic(), sums(server.url), self.cpu()

    def cpu(self) -> dict[str, float]:
        return {k: (t := p.cpu_times()).user + t.system for k, p in self.procs.items()}

    def end(self) -> dict[str, Any]:
        took = time.monotonic() - self.t0
        s1, c1 = sums(self.server.url), self.cpu()
        d = {k: s1[k] - self.s0[k] for k in s1}
        means = {
            f"{n}_mean_s": d[f"{n}_sum"] / d[f"{n}_count"] if d[f"{n}_count"] else None
            for n in SPLITS
        }
        cores = {f"{k}_cpu_cores": (c1[k] - self.c0[k]) / took for k in c1}
        return {**means, **cores, "seconds": took}


def batch_file(args: argparse.Namespace, path: str | None, n: int, seed: int) -> bytes:
    lines = []
    for p in prompts(workload(args, path), seed):
        if len(lines) == n:
            break
        body = {
            "model": "test-model",
            "prompt": p.full_text,
            "max_tokens": p.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        lines.append(
            json.dumps(
                {
                    "custom_id": f"line-{p.index}",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": body,
                }
            )
        )
    return "\n".join(lines).encode()


def submit(url: str, data: bytes) -> str:
    with httpx.Client(base_url=url, timeout=120) as c:
        f = c.post("/v1/files", files={"file": ("lines.jsonl", data)}, data={"purpose": "batch"})
        f.raise_for_status()
        body = {
            "input_file_id": f.json()["id"],
            "endpoint": "/v1/completions",
            "completion_window": "24h",
        }
        b = c.post("/v1/batches", json=body)
        b.raise_for_status()
        return str(b.json()["id"])


def batch(url: str, batch_id: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/batches/{batch_id}", timeout=30)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def wait_for(
    url: str, batch_id: str, statuses: tuple[str, ...], timeout_s: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (b := batch(url, batch_id))["status"] not in statuses:
        if time.monotonic() > deadline:
            raise SystemExit(f"batch {batch_id} still {b['status']} after {timeout_s:.0f}s")
        time.sleep(0.25)
    return b


def valleys(server: ServerProcess, args: argparse.Namespace, path: str | None) -> dict[str, Any]:
    url = server.url
    g0 = metric(url, "vllm:generation_tokens_total")
    cap = bench(
        url, args, path, concurrency=args.capacity_clients,
        duration_s=args.capacity_duration, drain_s=30.0,
    )  # fmt: skip
    engine_tok_s = (metric(url, "vllm:generation_tokens_total") - g0) / cap.duration_s
    capacity_tok_s = cap.output_tok_s
    cap_rps = cap.request_rps
    load = ArrivalConfig(
        "sinusoid",
        base_rps=args.base * cap_rps,
        peak_rps=args.peak * cap_rps,
        period_s=args.duration,
    )
    kw = {"concurrency": None, "arrival": load, "duration_s": args.duration, "drain_s": 60.0}
    phase = Phase(server)
    alone = bench(url, args, path, **kw)
    split_alone = phase.end()
    batch_id = submit(url, batch_file(args, path, args.batch_lines, seed=args.seed + 1))
    wait_for(url, batch_id, ("in_progress",), 300)
    time.sleep(2.0)  # the batch up to its pace
    b0, t1 = metric(url, "surge:batch_tokens_total"), time.monotonic()
    phase = Phase(server)
    shared = bench(url, args, path, **kw)
    split_shared = phase.end()
    batch_tok_s = (metric(url, "surge:batch_tokens_total") - b0) / (time.monotonic() - t1)
    left = batch(url, batch_id)
    httpx.post(f"{url}/v1/batches/{batch_id}/cancel", timeout=30)
    leftover = capacity_tok_s - shared.output_tok_s
    p99 = (alone.ttft.p99 or 0.0, shared.ttft.p99 or 0.0)
    return {
        "capacity_tok_s": capacity_tok_s,
        "capacity_engine_counter_tok_s": engine_tok_s,
        "capacity_rps": cap_rps,
        "sinusoid_rps": [load.base_rps, load.peak_rps, load.period_s],
        "ttft_p99_s": {"without_batch": p99[0], "with_batch": p99[1]},
        "ttft_p99_ratio": p99[1] / p99[0] if p99[0] else None,
        "interactive_tok_s": {
            "without_batch": alone.output_tok_s,
            "with_batch": shared.output_tok_s,
        },
        "interactive_errors": {"without_batch": alone.num_errors, "with_batch": shared.num_errors},
        "batch_tok_s": batch_tok_s,
        "leftover_tok_s": leftover,
        "batch_share_of_leftover": batch_tok_s / leftover if leftover > 0 else None,
        "batch_lines_done_during_run": left["request_counts"],
        "server_side": {"without_batch": split_alone, "with_batch": split_shared},
        "targets": {"ttft_p99_ratio_at_most": 1.10, "batch_share_at_least": 0.80},
    }


def throughput(url: str, args: argparse.Namespace, path: str | None) -> dict[str, Any]:
    n = args.throughput_lines
    direct = bench(
        url,
        args,
        path,
        concurrency=args.batch_max_concurrency,
        num_requests=n,
        drain_s=60.0,
        num_warmup=2,
    )
    b0, t0 = metric(url, "surge:batch_tokens_total"), time.monotonic()
    batch_id = submit(url, batch_file(args, path, n, seed=args.seed + 2))
    done = wait_for(url, batch_id, ("completed", "failed", "expired", "cancelled"), 24 * 3600)
    took = time.monotonic() - t0
    batch_tok_s = (metric(url, "surge:batch_tokens_total") - b0) / took
    return {
        "lines": n,
        "batch_status": done["status"],
        "batch_seconds": took,  # upload to completed, files written
        "batch_tok_s": batch_tok_s,
        "direct_tok_s": direct.output_tok_s,
        "ratio": batch_tok_s / direct.output_tok_s if direct.output_tok_s else None,
        "target_ratio_at_least": 0.90,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of each sinusoid run")
    p.add_argument("--capacity-duration", type=float, default=30.0)
    p.add_argument("--capacity-clients", type=int, default=64)
    p.add_argument("--base", type=float, default=0.1, help="sinusoid low, share of capacity")
    p.add_argument("--peak", type=float, default=0.6, help="sinusoid high, share of capacity")
    p.add_argument("--batch-lines", type=int, default=5000)
    p.add_argument("--throughput-lines", type=int, default=0, help="0: skip phase 4")
    p.add_argument(
        "--no-valleys", action="store_true", help="skip phases 1-3 (phase 4 alone: target 4)"
    )
    p.add_argument("--batch-max-concurrency", type=int, default=64)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("server_args", nargs="*", help="after --: more `surge serve` flags")
    args = p.parse_args(argv)
    path = str(resolve_model(args.model))
    tok = Path(path) / "tokenizer.json"
    tokenizer = str(tok) if tok.is_file() else None  # a GGUF: prompts of about that length
    with tempfile.TemporaryDirectory(prefix="surge-batch-bench-") as data:
        server = ServerProcess(
            path,
            "--data-dir",
            data,
            "--batch-max-concurrency",
            str(args.batch_max_concurrency),
            *args.server_args,
        )
        try:
            out: dict[str, Any] = {"model": args.model}
            if not args.no_valleys:
                out["valleys"] = valleys(server, args, tokenizer)
            if args.throughput_lines:
                out["throughput"] = throughput(server.url, args, tokenizer)
        finally:
            server.stop()
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
