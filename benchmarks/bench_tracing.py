"""What tracing costs: gateway + server with OpenTelemetry spans exported vs without, in one run.

Starts two stacks on 127.0.0.1, each a `surge serve` (the default model) behind a `surge
gateway`, identical but for `--otlp-traces-endpoint` on both processes of stack "traced", whose
spans go to an OTLP/HTTP receiver in this process (it decodes them, as a collector would, and
counts them). Closed-loop clients send chat requests with a `traceparent` to each gateway in
turn, alternating the order per round so that the machine's drifting speed hits both alike.
Prints requests/s and latency per round and the median ratio traced/untraced. Every process is
stopped by its PID at the end.

    python benchmarks/bench_tracing.py --clients 16 --max-tokens 1,16 --rounds 3 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_embeddings import closed_loop_requests, pct, stop_all, wait_ready
from tests.observability.otlp_receiver import OtlpReceiver
from tests.servers import free_port

PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "Name three colours.",
    "Why is the sky blue?",
]


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "surge.cli", *args]
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


async def closed_loop(
    url: str, clients: int, seconds: float, max_tokens: int
) -> tuple[float, list[float]]:
    """(requests per second, latencies in s): chat requests, each with a traceparent."""

    def make(i: int, n: int) -> tuple[dict[str, object], dict[str, str]]:
        body: dict[str, object] = {
            "messages": [{"role": "user", "content": PROMPTS[(i + n) % len(PROMPTS)]}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
        return body, {"traceparent": traceparent}

    return await closed_loop_requests(url, clients, seconds, "/v1/chat/completions", make)


def span_cost(n: int = 5000) -> None:
    """CPU per span in the process that records it: start + end with a server span's 18
    attributes and 2 events, then the OTLP protobuf encoding the exporter's thread does."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    kept: list[ReadableSpan] = []

    class Keep(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            kept.extend(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Keep()))
    tracer = provider.get_tracer("bench")
    attributes = {f"gen_ai.attribute_{i}": i * 0.5 for i in range(18)}
    t0 = time.perf_counter()
    for _ in range(n):
        span = tracer.start_span("chat smollm2-135m", attributes=attributes)
        span.add_event("queued")
        span.add_event("first_token")
        span.end()
    t1 = time.perf_counter()
    for i in range(0, n, 512):  # the batch processor's default export size
        encode_spans(kept[i : i + 512]).SerializeToString()
    t2 = time.perf_counter()
    print(f"per span: start+end {(t1 - t0) / n * 1e6:.0f} us, OTLP encoding "
          f"{(t2 - t1) / n * 1e6:.0f} us", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    span_cost()
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    procs: list[subprocess.Popen[bytes]] = []
    gateways: dict[str, str] = {}
    with OtlpReceiver() as receiver:
        try:
            for name in ("untraced", "traced"):
                trace = ["--otlp-traces-endpoint", receiver.url] if name == "traced" else []
                sport, gport = free_port(), free_port()
                server = start(["serve", "--port", str(sport), *trace],
                               tmp / f"bench-tracing-{name}-server.log")  # fmt: skip
                procs.append(server)
                wait_ready(f"http://127.0.0.1:{sport}", server)
                gateway = start(
                    ["gateway", "--port", str(gport), "--upstream", f"http://127.0.0.1:{sport}",
                     *trace], tmp / f"bench-tracing-{name}-gateway.log",
                )  # fmt: skip
                procs.append(gateway)
                gateways[name] = f"http://127.0.0.1:{gport}"
                wait_ready(gateways[name], gateway)
            for url in gateways.values():  # warm-up
                asyncio.run(closed_loop(url, 4, 2.0, 4))
            time.sleep(6)  # the warm-up's spans leave (in batches, every 5 s)
            spans_before, sent = len(receiver.spans), 0
            print("{:>10} {:>5} {:>9} {:>7} {:>8} {:>8}".format(
                "max_tokens", "round", "config", "req/s", "p50 ms", "p99 ms"))  # fmt: skip
            for max_tokens in [int(m) for m in args.max_tokens.split(",")]:
                ratios = []
                for rnd in range(args.rounds):
                    rate: dict[str, float] = {}
                    order = list(gateways) if rnd % 2 == 0 else list(reversed(gateways))
                    for name in order:
                        rate[name], lat = asyncio.run(
                            closed_loop(gateways[name], args.clients, args.seconds, max_tokens)
                        )
                        if name == "traced":
                            sent += len(lat)
                        print(
                            f"{max_tokens:>10} {rnd:>5} {name:>9} {rate[name]:>7.1f} "
                            f"{pct(lat, 0.5) * 1e3:>8.1f} {pct(lat, 0.99) * 1e3:>8.1f}",
                            flush=True,
                        )
                    ratios.append(rate["traced"] / rate["untraced"])
                print(
                    f"max_tokens {max_tokens}, {args.clients} clients: traced/untraced req/s, "
                    f"median of {args.rounds}: {statistics.median(ratios):.3f}x",
                    flush=True,
                )
            time.sleep(6)  # the exporters' last batches
            got = len(receiver.spans) - spans_before
            print(f"spans received for {sent} traced requests: {got} ({got / max(sent, 1):.2f} "
                  "per request; 3 expected: gateway, attempt, server)")  # fmt: skip
        finally:
            stop_all(procs)


if __name__ == "__main__":
    main()
