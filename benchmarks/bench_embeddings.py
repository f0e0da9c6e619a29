"""/v1/embeddings with and without dynamic batching, through HTTP, in one run.

Starts two `surge serve --embedding-model all-minilm-l6-v2` servers on 127.0.0.1 that differ only
in the batcher (A: the defaults, batches of up to 32, no queue delay; B: batches of one, i.e.
no batching), then alternates closed-loop rounds between them at each concurrency
(each client sends its next single-sentence request when the previous answer arrives), so that
the machine's drifting speed hits both alike. Prints inputs/s and latency per round and the
median ratio A/B. The servers are stopped by their PID at the end.

    python benchmarks/bench_embeddings.py --clients 1,8,32,64 --rounds 3 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import free_port

WORDS = [
    "the",
    "a",
    "model",
    "serves",
    "many",
    "users",
    "at",
    "once",
    "requests",
    "join",
    "batch",
    "every",
    "step",
    "cache",
    "block",
    "token",
    "queue",
    "latency",
    "throughput",
    "embedding",
    "vector",
    "search",
    "query",
    "document",
    "retrieval",
    "similar",
]


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30))).capitalize() + "."


def start_server(port: int, extra: list[str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "surge.cli", "serve", "--port", str(port),
        "--kv-cache-memory-gib", "0.25", "--embedding-model", "all-minilm-l6-v2",
        "--embedding-model-name", "emb", *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server at {url} exited early")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server at {url} not ready")


class KeepAliveConnection:
    """One HTTP/1.1 keep-alive connection, written by hand: on a 2-core box httpx's client with 64
    connections used a whole core (8.1 s of CPU in an 8 s round), so the load generator, not the
    server, set the pace. This one parses only what uvicorn sends back (Content-Length bodies)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post_json(
        self, path: str, body: dict[str, object], headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        payload = json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode() + payload)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        length = 0
        for line in header.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


RequestMaker = Callable[[int, int], tuple[dict[str, object], dict[str, str]]]


async def closed_loop_requests(
    url: str, clients: int, seconds: float, path: str, make: RequestMaker
) -> tuple[float, list[float]]:
    """(requests per second, latencies in s) of `clients` closed-loop clients for `seconds`,
    each sending `make(client, n)` = (JSON body, headers) as its n-th request to `path`."""
    latencies: list[float] = []
    host, port = url.removeprefix("http://").split(":")
    stop_at = time.perf_counter() + seconds

    async def client(i: int) -> None:
        conn = KeepAliveConnection(host, int(port))
        n = 0
        try:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                body, headers = make(i, n)
                status, data = await conn.post_json(path, body, headers)
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
                latencies.append(time.perf_counter() - t0)
                n += 1
        finally:
            await conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.perf_counter() - start
    return len(latencies) / elapsed, latencies


async def closed_loop(
    url: str, clients: int, seconds: float, seed: int
) -> tuple[float, list[float]]:
    """(inputs per second, latencies in s): one random sentence per request."""
    rngs = [random.Random(seed * 1000 + i) for i in range(clients)]

    def make(i: int, n: int) -> tuple[dict[str, object], dict[str, str]]:
        return {"model": "emb", "input": sentence(rngs[i]), "encoding_format": "base64"}, {}

    return await closed_loop_requests(url, clients, seconds, "/v1/embeddings", make)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to every process still running (each drains), then wait; SIGKILL after 30 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="1,8,32,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    configs = {
        "batched": [],  # the defaults
        "unbatched": ["--embedding-max-batch-size", "1", "--embedding-max-queue-delay-ms", "0"],
    }
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    servers: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
    try:
        for name, extra in configs.items():
            port = free_port()
            proc = start_server(port, extra, tmp / f"bench-embeddings-{name}.log")
            servers[name] = (f"http://127.0.0.1:{port}", proc)
        for url, proc in servers.values():
            wait_ready(url, proc)
        for url, _ in servers.values():  # warm-up: first batches allocate
            asyncio.run(closed_loop(url, 8, 1.0, seed=99))
        cols = ("clients", "round", "config", "inputs/s", "p50 ms", "p99 ms")
        print("{:>7} {:>5} {:>10} {:>9} {:>7} {:>7}".format(*cols))
        for clients in [int(c) for c in args.clients.split(",")]:
            ratios = []
            for rnd in range(args.rounds):
                rate: dict[str, float] = {}
                order = list(servers) if rnd % 2 == 0 else list(reversed(servers))
                for name in order:
                    url, _ = servers[name]
                    rate[name], lat = asyncio.run(closed_loop(url, clients, args.seconds, rnd))
                    print(
                        f"{clients:>7} {rnd:>5} {name:>10} {rate[name]:>9.1f} "
                        f"{pct(lat, 0.5) * 1e3:>7.1f} {pct(lat, 0.99) * 1e3:>7.1f}",
                        flush=True,
                    )
                ratios.append(rate["batched"] / rate["unbatched"])
            print(
                f"{clients:>7} clients: batched/unbatched inputs/s, median of {args.rounds}: "
                f"{statistics.median(ratios):.2f}x",
                flush=True,
            )
    finally:
        stop_all([proc for _, proc in servers.values()])


if __name__ == "__main__":
    main()
