"""Scheduling policies under overload, measured with `surge bench` against real servers.

1. Priority: capacity C (req/s) from a closed loop at --max-num-seqs clients; the unloaded p99
   TTFT of urgent requests (Poisson at 0.1 C, all priority 0); then Poisson at 2 C with 20% urgent
   (priority 0) and 80% background (priority 10), against a `priority` server and an `fcfs` one.
   Target: urgent p99 TTFT at 2x overload within 1.5x its unloaded value.
2. Fair share: a 10:1 noisy neighbour (tenants a:10, b:1 by request share) at 2 C against `fcfs`
   and `fair` servers: each tenant's throughput and TTFT, and a per-tenant throughput plot.

    python -m benchmarks.bench_scheduling [--model smollm2-135m] [--duration 60] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from surge.bench.config import ArrivalConfig, BenchConfig, LengthDist, Tenant, WorkloadConfig
from surge.bench.drive import RunResult, run
from surge.bench.metrics import Report, summarize
from surge.bench.plots import save_plots
from tests.servers import ServerProcess


def workload(tenants: tuple[Tenant, ...] = (), priority: int | None = None) -> WorkloadConfig:
    return WorkloadConfig(
        input_len=LengthDist("fixed", 64),
        output_len=LengthDist("fixed", 32),
        tenants=tenants,
        priority=priority,
    )


def bench(url: str, label: str, **kw: object) -> tuple[RunResult, Report]:
    config = BenchConfig(url, "test-model", label=label, **kw)  # type: ignore[arg-type]
    result = asyncio.run(run(config))
    return result, summarize(result.records, duration_s=result.duration_s)


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def start(model: str, policy: str, max_seqs: int) -> ServerProcess:
    return ServerProcess(
        model,
        "--scheduling-policy",
        policy,
        "--max-num-seqs",
        str(max_seqs),
        "--kv-cache-memory-gib",
        "1",
        startup_timeout_s=600,
    )


def priority_experiment(args: argparse.Namespace, out: Path) -> dict[str, object]:
    rows: dict[str, object] = {}
    for policy in ("priority", "fcfs"):
        server = start(args.model, policy, args.max_seqs)
        try:
            _, cap = bench(
                server.url,
                "capacity",
                concurrency=args.max_seqs,
                num_requests=3 * args.max_seqs,
                num_warmup=2,
                workload=workload(),
            )
            capacity = cap.request_rps
            _, idle = bench(
                server.url,
                "unloaded",
                concurrency=None,
                arrival=ArrivalConfig("poisson", rate_rps=0.1 * capacity),
                num_requests=args.num_unloaded,
                workload=workload(priority=0),
            )
            mix = (Tenant("urgent", 1.0, 0), Tenant("background", 4.0, 10))
            result, over = bench(
                server.url,
                "2x overload",
                concurrency=None,
                arrival=ArrivalConfig("poisson", rate_rps=2 * capacity),
                duration_s=args.duration,
                drain_s=args.drain,
                workload=workload(tenants=mix),
                seed=1,
            )
            save_plots(
                result.records,
                out / f"priority-{policy}",
                duration_s=result.duration_s,
                title=f"{policy}: 2x overload, 20% urgent",
            )
        finally:
            server.stop()
        urgent, background = over.by_tenant["urgent"], over.by_tenant["background"]
        ratio = (urgent.ttft.p99 or 0) / (idle.ttft.p99 or float("inf"))
        rows[policy] = {
            "capacity_rps": capacity,
            "unloaded_p99_ttft_s": idle.ttft.p99,
            "urgent_p99_ttft_s": urgent.ttft.p99,
            "urgent_p50_ttft_s": urgent.ttft.p50,
            "background_p50_ttft_s": background.ttft.p50,
            "background_p99_ttft_s": background.ttft.p99,
            "ratio": ratio,
            "urgent_ok": urgent.num_ok,
            "background_ok": background.num_ok,
            "background_cancelled": background.num_cancelled,
        }
        print(
            f"[{policy}] capacity {capacity:.2f} req/s; unloaded urgent p99 TTFT "
            f"{ms(idle.ttft.p99)} ms; at 2x: urgent p50/p99 {ms(urgent.ttft.p50)}/"
            f"{ms(urgent.ttft.p99)} ms ({ratio:.2f}x unloaded), background p50/p99 "
            f"{ms(background.ttft.p50)}/{ms(background.ttft.p99)} ms, "
            f"{background.num_cancelled} background cut at the end",
            flush=True,
        )
    return rows


def fairness_experiment(args: argparse.Namespace, out: Path, capacity: float) -> dict[str, object]:
    rows: dict[str, object] = {}
    for policy in ("fair", "fcfs"):
        server = start(args.model, policy, args.max_seqs)
        try:
            mix = (Tenant("a", 10.0), Tenant("b", 1.0))
            result, rep = bench(
                server.url,
                "noisy neighbour",
                concurrency=None,
                arrival=ArrivalConfig("poisson", rate_rps=2 * capacity),
                duration_s=args.duration,
                drain_s=args.drain,
                workload=workload(tenants=mix),
                seed=2,
            )
            save_plots(
                result.records,
                out / f"fairness-{policy}",
                duration_s=result.duration_s,
                title=f"{policy}: tenants a:b = 10:1 requests at 2x capacity",
            )
        finally:
            server.stop()
        a, b = rep.by_tenant["a"], rep.by_tenant["b"]
        rows[policy] = {
            "a_output_tok_s": a.output_tok_s,
            "b_output_tok_s": b.output_tok_s,
            "a_p50_ttft_s": a.ttft.p50,
            "b_p50_ttft_s": b.ttft.p50,
            "b_p99_ttft_s": b.ttft.p99,
            "b_ok": b.num_ok,
            "b_sent": b.num_requests,
        }
        print(
            f"[{policy}] tenant a {a.output_tok_s:.1f} tok/s (p50 TTFT {ms(a.ttft.p50)} ms); "
            f"tenant b {b.output_tok_s:.1f} tok/s (p50/p99 TTFT {ms(b.ttft.p50)}/"
            f"{ms(b.ttft.p99)} ms, {b.num_ok}/{b.num_requests} done)",
            flush=True,
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-seqs", type=int, default=16)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--drain", type=float, default=5.0)
    p.add_argument("--num-unloaded", type=int, default=30)
    p.add_argument("--out", default="bench-results/scheduling")
    p.add_argument("--only", choices=["priority", "fairness"], default=None)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, object] = {}
    capacity = None
    if args.only in (None, "priority"):
        results["priority"] = prio = priority_experiment(args, out)
        capacity = prio["fcfs"]["capacity_rps"]  # type: ignore[index]
    if args.only in (None, "fairness"):
        if capacity is None:
            server = start(args.model, "fcfs", args.max_seqs)
            try:
                _, cap = bench(
                    server.url,
                    "capacity",
                    concurrency=args.max_seqs,
                    num_requests=3 * args.max_seqs,
                    num_warmup=2,
                    workload=workload(),
                )
            finally:
                server.stop()
            capacity = cap.request_rps
        results["fairness"] = fairness_experiment(args, out, capacity)
    (out / "summary.json").write_text(json.dumps(results, indent=2))
    print(f"results and plots in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
