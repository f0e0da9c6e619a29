"""Endpoint-picker decision time at a fixed request rate (issue #47's target: p99 <= 2 ms at
500 requests/s).

Starts `surge gateway --ext-proc-port` over N upstream addresses (probes and scrapes off, so
all stay in rotation and no model server is needed: the decision reads only the pool), then
plays Envoy: one ext_proc stream per request, opened on an open-loop schedule (request i at
i/rate s), in FULL_DUPLEX_STREAMED mode as GIE's gateways use it: the request headers, then the
body (a chat request: one of 8 shared system prompts of ~2 KB and a distinct question) in one
message with end_of_stream; the picker then answers with the routing headers and the body.

With `--policy kv_aware` the picker also tokenizes each prompt (`--kv-tokenizer`, SmolLM2's
by default), hashes its blocks and looks them up in its KV index. The upstreams are then small
stand-ins run here: each answers GET /version with a KV-events endpoint and publishes, over
ZMQ, BlockStored events for the blocks of the system prompts it "holds" (prompt i's on
upstream i mod N), so the lookups find real matches, as they would in a warm fleet. With
`--unique-prompts` every request's system prompt differs from the first token on (nothing to
find, nothing kept: the tokenizer's whole cost on every request).

Reported, in ms:
- `round trip`: from sending the body message to receiving the routing answer, measured by
  this client (gRPC both ways, the event loops of both processes, and the decision);
- `decision`: the picker's own `surge_epp_decision_seconds` (parse, hash, balance), from its
  /metrics histogram (bucket bounds: an upper bound of each percentile).

    python benchmarks/bench_epp_decision.py --rate 500 --duration 30 --json out.json
    python benchmarks/bench_epp_decision.py --policy kv_aware --rate 500 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from surge.gateway.epp.proto import base_pb2 as core  # noqa: E402
from surge.gateway.epp.proto import external_processor_pb2 as pb  # noqa: E402
from surge.gateway.epp.proto import external_processor_pb2_grpc as pb_grpc  # noqa: E402
from surge.gateway.epp.proto import processing_mode_pb2 as mode_pb  # noqa: E402
from surge.kv_events.hashing import HASH_SCHEME, block_hashes  # noqa: E402
from surge.kv_events.wire import BlockStored, KVEventBatch, encode_batch, message  # noqa: E402
from tests.servers import free_port  # noqa: E402

DUPLEX = mode_pb.ProcessingMode.FULL_DUPLEX_STREAMED
SYSTEM = [f"You are assistant {i} of the support desk. " + "Answer politely and briefly. " * 70
          for i in range(8)]  # fmt: skip


UNIQUE = False  # --unique-prompts


def body(i: int) -> bytes:
    system = (f"[{i}] " if UNIQUE else "") + SYSTEM[i % len(SYSTEM)]
    return json.dumps({"model": "m", "max_tokens": 64, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Question number {i}: where is my order?"},
    ]}).encode()  # fmt: skip


class FakeReplica:
    """An upstream as the kv_aware picker sees it: GET /version names a ZMQ KV-events endpoint,
    where this publishes the blocks of the prompts given (again every 0.2 s until stopped:
    a SUB socket misses what was published before it connected)."""

    def __init__(self, prompts: list[list[int]], block_size: int = 16) -> None:
        import zmq

        self.events_port = free_port()
        self.sock: Any = zmq.Context.instance().socket(zmq.PUB)
        self.sock.bind(f"tcp://127.0.0.1:{self.events_port}")
        hashes = [block_hashes(ids, block_size) for ids in prompts]
        self.payload = encode_batch(KVEventBatch(time.time(), [
            BlockStored(h, None, ids[: len(h) * block_size], block_size)
            for h, ids in zip(hashes, prompts, strict=True)
        ]))  # fmt: skip
        version = json.dumps({"version": "bench", "kv_events": {
            "endpoint": f"tcp://127.0.0.1:{self.events_port}", "replay_endpoint": None,
            "topic": "", "block_size": block_size, "hash": HASH_SCHEME,
        }}).encode()  # fmt: skip

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                out = version if self.path == "/version" else b"{}"
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: object, client_address: object) -> None:
                pass  # the picker gave up on an answer (a busy machine): it asks again

        self.http = Server(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_port}"
        self.stopped = threading.Event()
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        threading.Thread(target=self._publish, daemon=True).start()

    def _publish(self) -> None:
        seq = 0
        while not self.stopped.wait(0.2):
            self.sock.send_multipart(message(b"", seq, self.payload))
            seq += 1

    def close(self) -> None:
        self.stopped.set()
        self.http.shutdown()
        self.http.server_close()
        self.sock.close(linger=0)


def fake_replicas(n: int, tokenizer: str) -> list[FakeReplica]:
    from surge.gateway.kv_tokens import prompt_tokens

    held: list[list[list[int]]] = [[] for _ in range(n)]
    for i in range(len(SYSTEM)):
        tokens = prompt_tokens(json.loads(body(i)), tokenizer, 1 << 20)
        assert tokens is not None
        held[i % n].append(list(tokens.token_ids))
    return [FakeReplica(prompts) for prompts in held]


def index_ready(metrics: str, urls: list[str]) -> bool:
    """Every fake replica's blocks are in the picker's KV index."""
    seen = set()
    for line in metrics.splitlines():
        if line.startswith("surge_gateway_kv_index_blocks{") and float(line.split()[-1]) > 0:
            seen.add(line.split('upstream="', 1)[1].split('"', 1)[0])
    return seen >= set(urls)


def requests(i: int) -> list[pb.ProcessingRequest]:
    headers = core.HeaderMap(headers=[
        core.HeaderValue(key=k, raw_value=v.encode())
        for k, v in ((":method", "POST"), (":path", "/v1/chat/completions"),
                     ("content-type", "application/json"))
    ])  # fmt: skip
    config = pb.ProtocolConfiguration(request_body_mode=DUPLEX, response_body_mode=DUPLEX)
    return [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=headers),
                             protocol_config=config),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body(i), end_of_stream=True)),
    ]  # fmt: skip


async def one(stub: pb_grpc.ExternalProcessorStub, i: int, out: list[float]) -> None:
    call = stub.Process()
    first, last = requests(i)
    await call.write(first)
    sent = time.perf_counter()
    await call.write(last)
    answer = await call.read()
    if answer is grpc.aio.EOF or not answer.HasField("request_headers"):
        raise RuntimeError(f"request {i}: no routing answer: {answer}")
    out.append(time.perf_counter() - sent)
    await call.read()  # the body sent back
    await call.done_writing()  # the request is over: the picker releases its count
    while await call.read() is not grpc.aio.EOF:
        pass


async def drive(port: int, rate: float, duration_s: float) -> list[float]:
    out: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        await one(stub, 0, [])  # connect and warm up
        start = time.perf_counter()
        tasks = []
        for i in range(int(rate * duration_s)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(stub, i, out)))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = time.perf_counter() - start
    print(f"sent {len(tasks)} requests in {elapsed:.1f} s ({len(tasks) / elapsed:.0f}/s)")
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:  # an overloaded machine (the client falls behind): say so, keep the rest
        print(f"{len(failed)} streams failed, e.g. {failed[0]!r:.200}")
    return out


def histogram_quantiles(metrics: str, quantiles: tuple[float, ...]) -> dict[float, float]:
    """Upper bucket bounds (s) of the picker's decision-time quantiles."""
    buckets = []
    for line in metrics.splitlines():
        if line.startswith("surge_epp_decision_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1]
    return {q: next(le for le, n in buckets if n >= q * total) for q in quantiles}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=500.0, help="requests per second")
    p.add_argument("--duration", type=float, default=30.0, help="seconds")
    p.add_argument("--upstreams", type=int, default=8)
    p.add_argument("--policy", default="prefix")
    p.add_argument("--kv-tokenizer", default="smollm2-135m", help="kv_aware: the model")
    p.add_argument("--unique-prompts", action="store_true",
                   help="every system prompt distinct: no kept tokens, no index match")  # fmt: skip
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    global UNIQUE
    UNIQUE = args.unique_prompts
    port, epp_port = free_port(), free_port()
    kv = args.policy == "kv_aware"
    fakes = fake_replicas(args.upstreams, args.kv_tokenizer) if kv else []
    urls = [f.url for f in fakes] or [f"http://10.0.0.{i + 1}:8000" for i in range(args.upstreams)]
    kv_args = ["--kv-tokenizer", args.kv_tokenizer] if kv else []
    cmd = [sys.executable, "-m", "surge.cli", "gateway", "--port", str(port), "--ext-proc-port",
           str(epp_port), "--health-interval", "0", "--scrape-interval", "0", "--policy",
           args.policy, "--log-level", "WARNING", *kv_args,
           *(a for u in urls for a in ("--upstream", u))]  # fmt: skip
    picker = subprocess.Popen(cmd, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                if r.status_code == 200 and (
                    not kv or index_ready(httpx.get(f"http://127.0.0.1:{port}/metrics").text, urls)
                ):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or picker.poll() is not None:
                raise RuntimeError("the picker did not start (or its KV index stayed empty)")
            time.sleep(0.2)
        for f in fakes:
            f.stopped.set()  # the index holds the blocks: no more events during the run
        times = asyncio.run(drive(epp_port, args.rate, args.duration))
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        picker.terminate()
        picker.wait(30)
        for f in fakes:
            f.close()
    qs = statistics.quantiles(times, n=1000)
    trip = {"p50": qs[499] * 1e3, "p99": qs[989] * 1e3, "max": max(times) * 1e3}
    own = {f"p{round(q * 100)}": v * 1e3
           for q, v in histogram_quantiles(metrics, (0.5, 0.99)).items()}  # fmt: skip
    print(f"round trip ms: p50 {trip['p50']:.3f}  p99 {trip['p99']:.3f}  max {trip['max']:.3f}")
    print(f"decision ms (bucket upper bounds): p50 <= {own['p50']:g}  p99 <= {own['p99']:g}")
    if args.json:
        result = {"rate": args.rate, "duration_s": args.duration, "upstreams": args.upstreams,
                  "policy": args.policy, "unique_prompts": args.unique_prompts,
                  "requests": len(times), "round_trip_ms": trip,
                  "decision_ms_upper_bound": own}  # fmt: skip
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
