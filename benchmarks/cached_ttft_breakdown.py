"""Where a prefix-cache hit's time to first token goes, from the server's own histograms: a real
`surge serve` on 127.0.0.1, a prompt of `--words` random words sent once (computed), then twice
again with a few words more (its prefix cached), /metrics read around each hit.

    python benchmarks/cached_ttft_breakdown.py [--words 1000] [--rounds 12] [-- serve flags]

Per hit: the client's TTFT; `surge:request_overhead_seconds` (HTTP arrival to the engine's
queue: parsing, chat template, tokenization, admission); `vllm:request_queue_time_seconds`
(arrival to first scheduled, the overhead included); `vllm:time_to_first_token_seconds`
(server side); the engine's step seconds. Medians over the hits after two warm-up rounds.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench_cached_ttft import WORDS  # noqa: E402

from tests.servers import free_port, stop_process, wait_healthy  # noqa: E402

SERIES = {
    "overhead (arrival -> queued)": "surge:request_overhead_seconds_sum",
    "queue time (arrival -> scheduled)": "vllm:request_queue_time_seconds_sum",
    "server TTFT": "vllm:time_to_first_token_seconds_sum",
    "engine step time": "surge:engine_step_seconds_total",
}


def scrape(client: httpx.Client, url: str) -> dict[str, float]:
    text = client.get(url + "/metrics").text
    out = {}
    for name in SERIES.values():
        m = re.search("^" + re.escape(name) + r"(\{[^}]*\})? (\S+)$", text, re.M)
        out[name] = float(m.group(2)) if m else float("nan")
    return out


def ttft(client: httpx.Client, url: str, content: str) -> float:
    """Seconds to the first chunk after the role chunk of a streamed one-token answer."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1,
            "temperature": 0, "stream": True}  # fmt: skip
    t0, chunks, first = time.perf_counter(), 0, float("nan")
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                chunks += 1
                if chunks == 2:
                    first = time.perf_counter() - t0
    return first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--words", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("extra", nargs="*", help="surge serve flags, after --")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(f"/tmp/cached-ttft-breakdown-{port}.log", "w")  # noqa: SIM115 (open while it runs)
    proc = subprocess.Popen([sys.executable, "-m", "surge.cli", "serve", "--port", str(port),
                             "--max-queue-wait", "0", *args.extra], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    rows: dict[str, list[float]] = {"client TTFT": []} | {k: [] for k in SERIES}
    try:
        why = wait_healthy(proc, url, 600)
        if why is not None:
            raise SystemExit(f"surge serve {why}; log {log.name}")
        rng = random.Random(1)
        with httpx.Client(timeout=120) as client:
            for rnd in range(args.rounds):
                base = " ".join(rng.choice(WORDS) for _ in range(args.words))
                ttft(client, url, base)  # computed once: its prefix is cached from here on
                for _ in range(2):
                    before = scrape(client, url)
                    t = ttft(
                        client, url, base + " " + " ".join(rng.choice(WORDS) for _ in range(8))
                    )
                    time.sleep(0.05)  # the request's metrics recorded
                    after = scrape(client, url)
                    if rnd >= 2:
                        rows["client TTFT"].append(t)
                        for label, name in SERIES.items():
                            rows[label].append(after[name] - before[name])
    finally:
        stop_process(proc, 30)
    print(f"prefix-cache hits after ~{args.words} words, medians of {len(rows['client TTFT'])}:")
    for label, values in rows.items():
        print(f"  {label:36s} {statistics.median(values) * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
