"""A realistic day-cycle trace in the JSONL format `surge bench --trace` reads, for the
autoscaler's simulator (`surge autoscale simulate --traffic trace:FILE`).

No public trace can be fetched here, so it is synthesized from what the public ones show
(Azure LLM inference traces 2023/2024, BurstGPT): a working-day shape with a morning rise, a
lunch dip, an afternoon peak and a night trough (peak/trough ~10x), days that differ by +-10%,
minute-scale burstiness (the rate of each 5-minute slot scaled by a lognormal factor, sigma
0.25), a nightly batch job (a burst of requests at 02:00 within a minute), and lognormal prompt
and output lengths (conversation-like: median prompt ~600 tokens, output ~180). Arrivals are
surge bench's own step process (Poisson within each slot), not re-implemented.

    python benchmarks/make_trace.py --days 3 --peak 20 --output deploy/traces/diurnal-3d.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from surge.bench.arrivals import step

SLOT_S = 300.0


def day_shape(hour: float) -> float:
    """Relative load over a working day (1.0 at the afternoon peak)."""
    morning = math.exp(-(((hour - 10.5) / 2.2) ** 2))
    afternoon = math.exp(-(((hour - 15.5) / 2.5) ** 2))
    lunch = 0.25 * math.exp(-(((hour - 12.8) / 0.6) ** 2))
    evening = 0.35 * math.exp(-(((hour - 20.5) / 2.0) ** 2))
    return max(0.0, 0.85 * morning + afternoon - lunch + evening)


def rates(days: int, peak: float, trough: float, rng: np.random.Generator) -> list[float]:
    top = max(day_shape(h / 12) for h in range(24 * 12))
    out = []
    for _d in range(days):
        day_factor = 1 + 0.1 * float(rng.uniform(-1, 1))
        for k in range(int(86400 / SLOT_S)):
            shape = day_shape(k * SLOT_S / 3600) / top
            burst = float(rng.lognormal(-(0.25**2) / 2, 0.25))
            out.append(max(0.0, (trough + (peak - trough) * shape) * day_factor * burst))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--peak", type=float, default=20.0)
    ap.add_argument("--trough", type=float, default=2.0)
    ap.add_argument("--batch-size", type=int, default=1500, help="the 02:00 job's requests")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    slots = rates(args.days, args.peak, args.trough, rng)
    steps = (*tuple((i * SLOT_S, r) for i, r in enumerate(slots)), (len(slots) * SLOT_S, 0.0))
    times = list(step(steps, np.random.default_rng([args.seed, 1])))
    for d in range(args.days):  # the nightly batch job: spread over its first minute
        times += list(d * 86400 + 7200 + rng.uniform(0, 60, size=args.batch_size))
    times.sort()
    prompt = rng.lognormal(math.log(600), 0.8, size=len(times)).clip(16, 4000)
    output = rng.lognormal(math.log(180), 0.7, size=len(times)).clip(8, 1024)
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t, p, o in zip(times, prompt, output, strict=True):
            row = {"t": round(t, 3), "prompt_tokens": int(p), "max_tokens": int(o)}
            f.write(json.dumps(row) + "\n")
    print(f"{len(times)} requests over {args.days} days: {path}")


if __name__ == "__main__":
    main()
