"""The autoscaler under a step of load: how soon it adds a replica, when it gives it back, and
whether any request fails on the way. A behaviour benchmark, not a capacity one: on a 2-core box
two replicas share the same cores.

Starts `surge autoscale` (gateway + local replicas of the default model) on 127.0.0.1, then runs
closed-loop clients through the gateway in phases (low, high, low), sampling the autoscaler's
metrics every 0.5 s. Prints the timeline of replica counts and, per phase, requests, failures and
latency. Everything it started is stopped by PID at the end.

    python benchmarks/bench_autoscale.py --phases 1:20,12:40,1:40 [--cpus-per-replica 0]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import free_port


def metric(text: str, name: str, labels: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or line.startswith(name + labels + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def main_async(args: argparse.Namespace) -> None:
    port, mport = free_port(), free_port()
    log_dir = Path(args.log_dir)
    cmd = [
        sys.executable, "-m", "surge.cli", "autoscale", "--port", str(port),
        "--base-port", str(free_port()), "--metrics-port", str(mport), "--log-dir", str(log_dir),
        "--min-replicas", "1", "--max-replicas", str(args.max_replicas),
        "--target-ongoing", str(args.target_ongoing), "--interval", "1",
        "--scale-down-window", str(args.scale_down_window),
        "--cpus-per-replica", args.cpus_per_replica, "--",
        "--max-num-seqs", str(args.max_num_seqs), "--kv-cache-memory-gib", "0.5",
    ]  # fmt: skip
    log = (log_dir / "bench-autoscale.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=300) as http:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                try:
                    if (await http.get(url + "/health")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.5)
            else:
                raise RuntimeError("the gateway did not come up; see bench-autoscale.log")
            await run_phases(http, url, f"http://127.0.0.1:{mport}/metrics", args)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


async def run_phases(
    http: httpx.AsyncClient, url: str, metrics_url: str, args: argparse.Namespace
) -> None:
    phases = [tuple(int(x) for x in p.split(":")) for p in args.phases.split(",")]
    t0 = time.monotonic()
    records: list[tuple[float, float, bool]] = []  # (start, latency, ok)
    timeline: list[tuple[float, int, int, int]] = []  # (t, ready, starting, draining)
    stop_sampling = asyncio.Event()

    async def sample() -> None:
        while not stop_sampling.is_set():
            text = (await http.get(metrics_url)).text
            state = [int(metric(text, "surge_autoscaler_replicas", f'{{state="{s}"}}'))
                     for s in ("ready", "starting", "draining")]  # fmt: skip
            if not timeline or tuple(state) != timeline[-1][1:]:
                timeline.append((time.monotonic() - t0, *state))  # type: ignore[arg-type]
            await asyncio.sleep(0.5)

    async def client(i: int, until: float) -> None:
        n = 0
        while time.monotonic() < until:
            start = time.monotonic()
            body = {"prompt": f"Client {i} request {n}: tell a story.", "max_tokens": 64,
                    "ignore_eos": True}  # fmt: skip
            try:
                ok = (await http.post(url + "/v1/completions", json=body)).status_code == 200
            except httpx.HTTPError:
                ok = False
            records.append((start - t0, time.monotonic() - start, ok))
            n += 1

    sampler = asyncio.create_task(sample())
    bounds = []
    for clients, seconds in phases:
        begin = time.monotonic()
        await asyncio.gather(*(client(i, begin + seconds) for i in range(clients)))
        bounds.append((begin - t0, time.monotonic() - t0, clients))
    await asyncio.sleep(args.tail)  # let a last scale-down happen
    stop_sampling.set()
    await sampler

    print("timeline (s since start: ready / starting / draining replicas)")
    for t, ready, starting, draining in timeline:
        print(f"  {t:7.1f}  {ready} / {starting} / {draining}")
    print(f"{'phase':>5} {'clients':>7} {'from s':>7} {'to s':>7} {'requests':>8} {'failed':>6} "
          f"{'p50 s':>6} {'p99 s':>6}")  # fmt: skip
    for k, (begin, end, clients) in enumerate(bounds):
        mine = [r for r in records if begin <= r[0] < end]
        lat = sorted(r[1] for r in mine)
        failed = sum(1 for r in mine if not r[2])
        p50 = statistics.median(lat) if lat else float("nan")
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        print(f"{k:>5} {clients:>7} {begin:>7.1f} {end:>7.1f} {len(mine):>8} {failed:>6} "
              f"{p50:>6.2f} {p99:>6.2f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", default="1:20,12:40,1:40", help="clients:seconds,...")
    ap.add_argument("--max-replicas", type=int, default=2)
    ap.add_argument("--target-ongoing", type=float, default=4)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--scale-down-window", type=float, default=15)
    ap.add_argument("--cpus-per-replica", default="auto", help="auto, or 0 for no pinning")
    ap.add_argument("--tail", type=float, default=25.0, help="seconds sampled after the load")
    ap.add_argument("--log-dir", default="/tmp")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
