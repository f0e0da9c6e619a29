"""Build every compiled CPU kernel now, several at a time:

    python -m surge.models.kernels [--jobs N]

Each is otherwise built on first use, one after another, each compile on one core (~45 s apiece
on this 2-core machine); `make test` runs this first so the suite does not pay them in series.
With SURGE_KERNEL_TIER=avx512|avx2|scalar it builds that lower tier's (kernels/__init__.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def _build(name: str) -> tuple[str, bool, float]:
    from surge.models.kernels import _load

    t0 = time.perf_counter()
    return name, _load(name, None) is not None, time.perf_counter() - t0


def main() -> int:
    from surge.models.kernels import KERNELS, kernel_tier, tier_runs_here

    ap = argparse.ArgumentParser(prog="python -m surge.models.kernels")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if not tier_runs_here(tier := kernel_tier()):
        print(f"SURGE_KERNEL_TIER={tier}: this CPU cannot run that tier's code; nothing built")
        return 0
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(_build, KERNELS))
    for name, ok, seconds in results:
        print(f"{name:14s} {'built' if ok else 'UNAVAILABLE (torch fallback)'} in {seconds:.1f} s")
    return 0  # a kernel that cannot build here is not an error: the torch path runs instead


if __name__ == "__main__":
    sys.exit(main())
