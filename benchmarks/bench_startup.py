"""How long `surge serve` takes from its process start to its first healthy /health, for one or
more source trees, rounds alternating between them (the machine drifts between runs).

    python benchmarks/bench_startup.py [--tree /path/to/other/checkout ...] [--rounds 3]
        [-- extra serve flags]

Each tree runs with this interpreter and its own `surge` package (the tree is the working
directory of `python -m surge.cli`); the default is this checkout alone.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import free_port


def time_to_healthy(tree: Path, extra: list[str], timeout_s: float = 300) -> float:
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "surge.cli", "serve", "--port", str(port), *extra],
        cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while time.perf_counter() - t0 < timeout_s:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise SystemExit(f"{tree}: surge serve exited with {proc.returncode}")
            time.sleep(0.02)
        raise SystemExit(f"{tree}: not healthy within {timeout_s} s")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", type=Path, default=[])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("extra", nargs="*", help="surge serve flags, after --")
    args = ap.parse_args()
    trees = [Path(__file__).resolve().parent.parent, *args.tree]
    times: dict[Path, list[float]] = {t: [] for t in trees}
    for rnd in range(args.rounds):
        for tree in trees if rnd % 2 == 0 else trees[::-1]:
            times[tree].append(time_to_healthy(tree, args.extra))
    for tree, ts in times.items():
        runs = ", ".join(f"{t:.2f}" for t in ts)
        print(f"{tree}: ready in {statistics.median(ts):.2f} s (median; runs {runs})")


if __name__ == "__main__":
    main()
