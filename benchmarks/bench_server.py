"""Through HTTP with streaming vs the offline engine on the same workload, in one script.

Workload: SmolLM2-135M, ~100-token prompts, 128 output tokens (ignore_eos), N concurrent streaming
clients (closed loop: each client sends its next request when the previous one ends). Prints output
tokens/s through HTTP, the offline engine's tokens/s for the same requests, their ratio, and the
server's own overhead per request (HTTP arrival to queued in the engine) from its /metrics.

    python benchmarks/bench_server.py [--clients 64] [--requests-per-client 2] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from surge import LLM, SamplingParams
from surge.models.formats.resolve import resolve_model

OUTPUT_LEN = 128


def prompts(llm: LLM, n: int) -> list[str]:
    text = (
        "Large language models are served to many users at once: requests join a running batch "
        "at every step, and the KV cache lives in fixed-size blocks. "
    ) * 8
    return [
        llm.tokenizer.decode(llm.tokenizer.encode(f"Request {i}. {text}")[:100]) for i in range(n)
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def client_loop(http: httpx.AsyncClient, texts: list[str], ttfts: list[float]) -> int:
    tokens = 0
    for text in texts:
        body = {
            "model": "bench", "prompt": text, "max_tokens": OUTPUT_LEN, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        t0 = time.perf_counter()
        first = None
        async with http.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if first is None and chunk["choices"]:
                    first = time.perf_counter() - t0
                if chunk.get("usage"):
                    tokens += chunk["usage"]["completion_tokens"]
        ttfts.append(first or 0.0)
    return tokens


def histogram_quantile(url: str, name: str, q: float) -> float:
    text = httpx.get(url + "/metrics").text
    buckets: list[tuple[float, float]] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name + "_bucket":
                buckets.append((float(s.labels["le"]), s.value))
    buckets.sort()
    total = buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= q * total:  # linear interpolation inside the bucket, as Prometheus does
            frac = (q * total - prev_count) / max(count - prev_count, 1e-9)
            return prev_le + (le - prev_le) * frac
        prev_le, prev_count = le, count
    return float("inf")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="alternating offline/HTTP runs")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    path = resolve_model("smollm2-135m")
    n = args.clients * args.requests_per_client
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "surge.cli", "serve", "--model", str(path), "--port", str(port),
         "--served-model-name", "bench", "--dtype", args.dtype],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        llm = LLM(str(path), dtype=args.dtype)
        texts = prompts(llm, n)
        params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_LEN, ignore_eos=True)
        llm.generate(texts[:2], SamplingParams(max_tokens=2), use_tqdm=False)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        api = psutil.Process(server.pid)
        engine = next(c for c in api.children() if "spawn_main" in " ".join(c.cmdline()))

        def cpu(p: psutil.Process) -> float:
            t = p.cpu_times()
            return t.user + t.system

        async def http_run() -> tuple[int, float, list[float]]:
            ttfts: list[float] = []
            limits = httpx.Limits(max_connections=args.clients + 8)
            async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
                await client_loop(http, texts[:1], [])  # warm-up
                t0 = time.perf_counter()
                per = args.requests_per_client
                counts = await asyncio.gather(
                    *[
                        client_loop(http, texts[i * per : (i + 1) * per], ttfts)
                        for i in range(args.clients)
                    ]
                )
                return sum(counts), time.perf_counter() - t0, ttfts

        # Alternate offline and HTTP runs: this machine's speed drifts by 10-20% over minutes.
        offline_rates, http_rates, all_ttfts = [], [], []
        used = [0.0, 0.0]
        http_time = 0.0
        for _ in range(args.rounds):
            t = time.perf_counter()
            llm.generate(texts, params, use_tqdm=False)
            offline_rates.append(n * OUTPUT_LEN / (time.perf_counter() - t))
            before = [cpu(api), cpu(engine)]
            tokens, dt, ttfts = asyncio.run(http_run())
            used = [u + cpu(p) - b for u, p, b in zip(used, (api, engine), before, strict=True)]
            http_time += dt
            http_rates.append(tokens / dt)
            all_ttfts += ttfts
        offline = statistics.median(offline_rates)
        http_tok_s = statistics.median(http_rates)
        p50 = histogram_quantile(url, "surge:request_overhead_seconds", 0.5)
        p99 = histogram_quantile(url, "surge:request_overhead_seconds", 0.99)
        all_ttfts.sort()
        print(f"clients={args.clients} requests={n} rounds={args.rounds} dtype={args.dtype}")
        print(f"offline engine  : {offline:8.1f} output tok/s (median; runs {_fmt(offline_rates)})")
        print(f"HTTP streaming  : {http_tok_s:8.1f} output tok/s (median; runs {_fmt(http_rates)})")
        print(f"ratio           : {http_tok_s / offline:8.2f}")
        print(f"server overhead : p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms (arrival->queued)")
        print(
            f"cores busy      : api {used[0] / http_time:.2f}, engine {used[1] / http_time:.2f}"
            f" (of {os.cpu_count()})"
        )
        p50_ttft, p99_ttft = all_ttfts[len(all_ttfts) // 2], all_ttfts[int(len(all_ttfts) * 0.99)]
        print(f"client TTFT     : p50 {p50_ttft:.3f}s p99 {p99_ttft:.3f}s")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values)


if __name__ == "__main__":
    main()
