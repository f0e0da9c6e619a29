"""Closed-loop streaming load against any OpenAI-compatible server: output tokens/s at N clients.

Each client sends ~100-token prompts for 128 tokens (ignore_eos) and its next request when the
previous one ends. Used by bench_llamacpp.sh to put Surge and llama.cpp's llama-server side by side.

    python benchmarks/bench_http.py --url http://127.0.0.1:8000 --model NAME --clients 1,64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

OUTPUT_LEN = 128
TEXT = (
    "Large language models are served to many users at once: requests join a running batch "
    "at every step, and the KV cache lives in fixed-size blocks. "
) * 8


async def one_client(http: httpx.AsyncClient, model: str, ids: list[int]) -> int:
    tokens = 0
    for i in ids:
        body = {
            "model": model, "prompt": f"Request {i}. {TEXT}"[:520], "max_tokens": OUTPUT_LEN,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        chunks, usage = 0, None
        async with http.stream("POST", "/v1/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]["completion_tokens"]
                    if chunk.get("choices") and chunk["choices"][0].get("text"):
                        chunks += 1
        tokens += usage if usage is not None else chunks  # usage when the server reports it
    return tokens


async def run(url: str, model: str, clients: int, per_client: int) -> float:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as http:
        await one_client(http, model, [10_000])  # warm-up
        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *[one_client(http, model, list(range(c * per_client, (c + 1) * per_client)))
              for c in range(clients)]
        )  # fmt: skip
        return sum(counts) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="default")
    ap.add_argument("--clients", default="1,64")
    ap.add_argument("--requests-per-client", type=int, default=1)
    ap.add_argument("--label", default="server")
    args = ap.parse_args()
    for c in (int(x) for x in args.clients.split(",")):
        per = max(args.requests_per_client, 4 if c == 1 else 1)
        rate = asyncio.run(run(args.url, args.model, c, per))
        print(f"{args.label:>12s}  clients={c:3d}  {rate:8.1f} output tok/s", flush=True)


if __name__ == "__main__":
    main()
