"""What `surge gateway` costs and what prefix-aware routing buys, in one script.

Starts N `surge serve` upstreams and three gateways (one in front of upstream 0 alone, one with
the prefix policy and one round robin over all N), then prints:

1. overhead: latency added by the gateway, p50/p99, from direct and gatewayed requests to the
   same upstream interleaved one by one (max_tokens 1), plus the gateway's own
   surge_gateway_overhead_seconds quantiles;
2. proxy throughput: req/s of a cheap proxied call (GET /v1/models) and of 1-token completions,
   closed loop, direct vs through the gateway;
3. prefix-aware vs round robin on a shared-prefix workload (G system prompts of ~2000 characters,
   each followed by distinct questions): the upstreams' prefix cache hit rate (from
   vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total) and TTFT p50/p90.

    python benchmarks/bench_gateway.py [--model smollm2-135m] [--upstreams 3] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import httpx

WORDS = ("latency", "cache", "token", "batch", "replica", "gateway", "prefix", "stream",
         "budget", "queue", "router", "kernel", "block", "tenant", "retry", "breaker")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A `surge ...` subprocess on a free port, waited for, stopped by PID."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "surge.cli", *args, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.proc.args} exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.proc.args} not ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def metric_sum(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram_quantile(url: str, name: str, q: float) -> float:
    buckets = []
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    return next((le for le, n in buckets if n >= q * total), float("nan")) if total else 0.0


async def overhead(direct: str, gateway: str, num: int) -> tuple[list[float], list[float]]:
    body = {"prompt": "Say something.", "max_tokens": 1, "temperature": 0}
    times: dict[str, list[float]] = {direct: [], gateway: []}
    async with httpx.AsyncClient(timeout=60) as http:
        for i in range(num):
            order = (direct, gateway) if i % 2 else (gateway, direct)  # interleaved, alternating
            for base in order:
                t0 = time.perf_counter()
                r = await http.post(base + "/v1/completions", json=body)
                r.raise_for_status()
                times[base].append(time.perf_counter() - t0)
    return times[direct], times[gateway]


async def closed_loop(url: str, method: str, path: str, body: dict | None, num: int,
                      concurrency: int) -> float:  # fmt: skip
    """Requests per second of `num` requests, `concurrency` at a time."""
    left = num

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            r = await http.request(method, url + path, json=body)
            r.raise_for_status()

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=None)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        return num / (time.perf_counter() - t0)


def shared_prefix_workload(num_groups: int, num: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    intro = "You answer questions about serving systems."
    systems = [
        f"[{seed}-{g}] {intro} " + " ".join(rng.choice(WORDS) for _ in range(260))
        for g in range(num_groups)
    ]
    return [
        [{"role": "system", "content": rng.choice(systems)},
         {"role": "user", "content": f"Question {i}: what is a {rng.choice(WORDS)}?"}]
        for i in range(num)
    ]  # fmt: skip


async def prefix_phase(gateway: str, upstreams: list[str], workload: list[list[dict[str, str]]],
                       concurrency: int, max_tokens: int) -> tuple[float, list[float]]:  # fmt: skip
    """(prefix cache hit rate over the upstreams, TTFTs) for the workload through `gateway`."""
    hits0 = sum(metric_sum(u, "vllm:prefix_cache_hits_total") for u in upstreams)
    queries0 = sum(metric_sum(u, "vllm:prefix_cache_queries_total") for u in upstreams)
    queue = list(workload)
    ttfts: list[float] = []

    async def worker(http: httpx.AsyncClient) -> None:
        while queue:
            messages = queue.pop()
            body = {"messages": messages, "max_tokens": max_tokens, "stream": True,
                    "temperature": 0, "ignore_eos": True}  # fmt: skip
            t0 = time.perf_counter()
            async with http.stream("POST", gateway + "/v1/chat/completions", json=body) as r:
                lines = r.aiter_lines()
                async for line in lines:
                    if line.startswith("data: {") and json.loads(line[6:])["choices"]:
                        delta = json.loads(line[6:])["choices"][0]["delta"]
                        if delta.get("content"):
                            ttfts.append(time.perf_counter() - t0)
                            break
                async for _ in lines:  # the rest of the stream
                    pass

    async with httpx.AsyncClient(timeout=300) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    hits = sum(metric_sum(u, "vllm:prefix_cache_hits_total") for u in upstreams) - hits0
    queries = sum(metric_sum(u, "vllm:prefix_cache_queries_total") for u in upstreams) - queries0
    return (hits / queries if queries else 0.0), ttfts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--upstreams", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200, help="per measurement")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prefix-groups", type=int, default=6)
    ap.add_argument("--prefix-concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8, help="shared-prefix phase outputs")
    args = ap.parse_args()

    upstreams = [Proc("serve", "--model", args.model, "--dtype", args.dtype,
                      "--served-model-name", "bench") for _ in range(args.upstreams)]  # fmt: skip
    procs = list(upstreams)
    try:
        for u in upstreams:
            u.wait()
        urls = [u.url for u in upstreams]
        every = [a for url in urls for a in ("--upstream", url)]
        one = Proc("gateway", "--upstream", urls[0])
        prefix = Proc("gateway", *every, "--policy", "prefix")
        rr = Proc("gateway", *every, "--policy", "round_robin")
        procs += [one, prefix, rr]
        for g in (one, prefix, rr):
            g.wait()

        direct, via = asyncio.run(overhead(urls[0], one.url, args.requests))
        print(f"overhead over {args.requests} interleaved pairs (1-token completions):")
        for q in (0.5, 0.99):
            d, g = pct(direct, q) * 1e3, pct(via, q) * 1e3
            print(f"  p{q * 100:g}: direct {d:.2f} ms, gateway {g:.2f} ms, added {g - d:.2f} ms")
        added_ms = (statistics.mean(via) - statistics.mean(direct)) * 1e3
        own = [histogram_quantile(one.url, "surge_gateway_overhead_seconds", q) * 1e3
               for q in (0.5, 0.99)]  # fmt: skip
        print(f"  mean added {added_ms:.2f} ms; the gateway's own overhead histogram: "
              f"p50 <= {own[0]:.2f} ms, p99 <= {own[1]:.2f} ms")  # fmt: skip

        c = args.concurrency
        tiny = {"prompt": "Hi", "max_tokens": 1, "temperature": 0}
        print(f"proxy throughput, closed loop, {c} at a time:")
        calls = [
            ("GET /v1/models", "GET", "/v1/models", None),
            ("1-token completions", "POST", "/v1/completions", tiny),
        ]
        for label, method, path, body in calls:
            d = asyncio.run(closed_loop(urls[0], method, path, body, args.requests, c))
            g = asyncio.run(closed_loop(one.url, method, path, body, args.requests, c))
            print(f"  {label}: direct {d:.0f} req/s, via gateway {g:.0f} req/s ({g / d:.2f}x)")

        num = max(args.prefix_groups * 4, args.requests // 2)
        print(f"shared prefix: {args.prefix_groups} system prompts, {num} requests, "
              f"{args.prefix_concurrency} at a time, {args.upstreams} upstreams:")  # fmt: skip
        for seed, (label, gateway) in enumerate((("round robin", rr), ("prefix-aware", prefix))):
            work = shared_prefix_workload(args.prefix_groups, num, seed)
            phase = prefix_phase(gateway.url, urls, work, args.prefix_concurrency, args.max_tokens)
            rate, ttfts = asyncio.run(phase)
            p50, p90 = pct(ttfts, 0.5) * 1e3, pct(ttfts, 0.9) * 1e3
            print(f"  {label:13s} cache hit rate {rate:6.1%}, TTFT p50 {p50:7.1f} ms, "
                  f"p90 {p90:7.1f} ms")  # fmt: skip
    finally:
        for p in reversed(procs):
            p.stop()


if __name__ == "__main__":
    main()
