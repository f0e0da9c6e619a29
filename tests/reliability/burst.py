"""A burst of streaming requests sent at once, each one's fate recorded (shared by the test and
benchmarks/burst.py)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx


@dataclass(slots=True)
class Outcome:
    status: int
    ttft_s: float | None = None  # client-side, from the send to the first token's chunk
    tokens: int = 0  # completion tokens, as the stream's closing usage chunk counts them
    finished: bool = False  # a finish_reason and [DONE] came
    error: dict[str, object] | None = None  # the OpenAI error body of a refusal or failure
    retry_after: str | None = None
    elapsed_s: float = 0.0


async def one(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> Outcome:
    t0 = time.monotonic()
    # Tokens are counted from usage: one chunk may carry several (held back by the detokenizer
    # for a whole character or a stop string, or sent together to a client that reads late).
    body = {**body, "stream_options": {"include_usage": True}}
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        out = Outcome(r.status_code, retry_after=r.headers.get("retry-after"))
        if r.status_code != 200:
            out.error = json.loads(await r.aread())
            out.elapsed_s = time.monotonic() - t0
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out.finished = out.finished and out.error is None
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out.error = chunk
                continue
            if chunk.get("usage"):
                out.tokens = chunk["usage"]["completion_tokens"]
            if not chunk.get("choices"):
                continue
            choice = chunk["choices"][0]
            if out.ttft_s is None:
                out.ttft_s = time.monotonic() - t0
            if choice.get("finish_reason"):
                out.finished = True
    out.elapsed_s = time.monotonic() - t0
    return out


async def burst(url: str, num: int, body: dict[str, object]) -> list[Outcome]:
    """`num` copies of `body` (a streaming completion) sent at once, on their own connections."""
    limits = httpx.Limits(max_connections=num + 8, max_keepalive_connections=0)
    timeout = httpx.Timeout(600.0, connect=60.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        return list(await asyncio.gather(*(one(client, url, body) for _ in range(num))))
