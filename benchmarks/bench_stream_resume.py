"""What an upstream killed mid-stream costs the client when the gateway continues the stream.

Starts two `surge serve` upstreams and a gateway (session affinity, so that each round's stream
goes to one upstream), then per round: a stream of `--tokens` greedy tokens, the upstream
serving it killed -9 after `--kill-after` events, the stream read to its end. Prints, per round
and as medians: the stall the client saw (the gap between the last event before the kill and
the first after it, against the median gap between events), and whether the text and the token
count came out whole. The killed upstream is started again between rounds.

    python benchmarks/bench_stream_resume.py [--model smollm2-135m] [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import Proc


def one_round(gateway: Proc, servers: dict[str, Proc], args: argparse.Namespace, r: int) -> dict:
    body = {"prompt": f"Round {r}. Write a long story about a lighthouse keeper.",
            "max_tokens": args.tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    times: list[float] = []
    events: list[dict] = []
    killed_at = -1
    with httpx.stream("POST", gateway.url + "/v1/completions", json=body, timeout=300,
                      headers={"x-session-id": f"round-{r}"}) as resp:  # fmt: skip
        victim = servers[resp.headers["x-surge-upstream"]]
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            times.append(time.perf_counter())
            events.append(json.loads(line[6:]))
            if len(events) == args.kill_after:
                os.kill(victim.proc.pid, signal.SIGKILL)
                killed_at = len(times)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    stall = times[killed_at] - times[killed_at - 1]
    usage = events[-1].get("usage") or {}
    return {
        "victim": victim.url,
        "stall_ms": stall * 1e3,
        "median_gap_ms": statistics.median(gaps) * 1e3,
        "completion_tokens": usage.get("completion_tokens"),
        "errors": sum(1 for e in events if "error" in e),
        "finish": [c.get("finish_reason") for c in events[-2].get("choices", [])],
    }


def restart(old: Proc, serve: tuple[str, ...]) -> Proc:
    """The killed upstream again, on its port (the gateway knows it by its URL)."""
    again = Proc.__new__(Proc)
    again.port, again.url = old.port, old.url
    cmd = [sys.executable, "-m", "surge.cli", *serve, "--port", str(old.port)]
    again.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    again.wait()
    return again


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--kill-after", type=int, default=60)
    args = ap.parse_args()
    serve = ("serve", "--model", args.model)
    servers = {p.url: p for p in (Proc(*serve), Proc(*serve))}
    gateway = None
    try:
        threads = [threading.Thread(target=p.wait) for p in servers.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ups = [a for url in servers for a in ("--upstream", url)]
        gateway = Proc("gateway", *ups, "--policy", "session", "--health-interval", "0.5")
        gateway.wait()
        rows = []
        for r in range(args.rounds):
            while httpx.get(gateway.url + "/health", timeout=5).json()["upstreams_in_rotation"] < 2:
                time.sleep(0.2)
            row = one_round(gateway, servers, args, r)
            rows.append(row)
            print(json.dumps(row), flush=True)
            victim = servers.pop(row["victim"])
            victim.proc.wait(30)
            servers[victim.url] = restart(victim, serve)
        stalls = [row["stall_ms"] for row in rows]
        gaps = [row["median_gap_ms"] for row in rows]
        whole = sum(1 for row in rows if row["errors"] == 0
                    and row["completion_tokens"] == args.tokens)  # fmt: skip
        print(f"\nstall at the kill: median {statistics.median(stalls):.1f} ms "
              f"(min {min(stalls):.1f}, max {max(stalls):.1f}); median gap between events "
              f"{statistics.median(gaps):.1f} ms; streams whole ({args.tokens} tokens, no error): "
              f"{whole} of {len(rows)}")  # fmt: skip
        return 0 if whole == len(rows) else 1
    finally:
        if gateway is not None:
            gateway.stop()
        for p in servers.values():
            p.stop()


if __name__ == "__main__":
    raise SystemExit(main())
