"""How long `surge serve` takes from its process start to its first healthy /health, for one or
more source trees, rounds alternating between them (the machine drifts between runs).

    python benchmarks/bench_startup.py [--tree /path/to/other/checkout ...] [--rounds 3]
        [--variant "serve flags" ...] [--first-request] [-- extra serve flags]

Each tree runs with this interpreter and its own `surge` package (the tree is the working
directory of `python -m surge.cli.main`); the default is this checkout alone. `--variant` adds a
set of serve flags to compare (e.g. "--calibration measure" against "--calibration cached"):
every tree runs with each variant, alternating. `--first-request` also times the first
request after healthy (a streamed chat completion of a ~500-token prompt, to its first token):
what a start leaves for the first user to pay.
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

PROMPT = "Serving many users at once means batching their requests together. " * 40


def first_token_s(port: int) -> float:
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                      timeout=120) as r:  # fmt: skip
        r.raise_for_status()
        chunks = 0
        for line in r.iter_lines():
            if line.startswith("data:"):
                chunks += 1
                if chunks == 2:  # the first after the role chunk
                    return time.perf_counter() - t0
    raise SystemExit("no token in the first answer")


def time_to_healthy(
    tree: Path, extra: list[str], timeout_s: float = 300, first: list[float] | None = None
) -> float:
    """Seconds from process start to a healthy /health; with `first`, also the first
    request's time to its first token, appended to it."""
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
                    ready = time.perf_counter() - t0
                    if first is not None:
                        first.append(first_token_s(port))
                    return ready
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
    ap.add_argument("--variant", action="append", default=[], help="serve flags to compare")
    ap.add_argument("--first-request", action="store_true")
    ap.add_argument("extra", nargs="*", help="surge serve flags, after --")
    args = ap.parse_args()
    trees = [Path(__file__).resolve().parent.parent, *args.tree]
    runs = [(t, v) for t in trees for v in (args.variant or [""])]
    times: dict[tuple[Path, str], list[float]] = {r: [] for r in runs}
    firsts: dict[tuple[Path, str], list[float]] = {r: [] for r in runs}
    for rnd in range(args.rounds):
        for tree, variant in runs if rnd % 2 == 0 else runs[::-1]:
            flags = [*args.extra, *variant.split()]
            first = firsts[(tree, variant)] if args.first_request else None
            times[(tree, variant)].append(time_to_healthy(tree, flags, first=first))
    for (tree, variant), ts in times.items():
        line = ", ".join(f"{t:.2f}" for t in ts)
        name = f"{tree} {variant}".strip()
        print(f"{name}: ready in {statistics.median(ts):.2f} s (median; runs {line})")
        if args.first_request:
            fs = firsts[(tree, variant)]
            print(
                f"  first request's first token: {statistics.median(fs) * 1e3:.0f} ms (median; "
                + ", ".join(f"{f * 1e3:.0f}" for f in fs)
                + ")"
            )


if __name__ == "__main__":
    main()
