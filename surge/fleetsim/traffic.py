"""The simulator's arrivals, from `surge bench`'s traffic models (surge/bench/arrivals.py) and
its trace format, not re-implemented: a spec is one of bench's `--traffic` specs, several joined
by `+` (their arrivals merged: a daily sinusoid plus hourly pulses), or `trace:FILE` (a JSONL
trace as `surge bench --trace` reads it; `trace:FILE,speedup=X`).

For the fluid mode the arrivals are counted per step; where that would mean drawing millions of
times, the rate models (constant, poisson, gamma, sinusoid, step) give Poisson counts of their
rate at each step's middle instead (exact for Poisson processes, gamma's burstiness lost).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from surge.bench import arrivals as bench_arrivals
from surge.bench.config import ArrivalConfig
from surge.bench.workload import trace_times

RATE_KINDS = ("constant", "poisson", "gamma", "sinusoid", "step")
MAX_DRAWN = 300_000  # arrivals drawn one by one in the fluid mode before rates take over
MAX_REQUESTS = 300_000  # --mode auto: per request up to this many arrivals, fluid past it


@dataclass(frozen=True, slots=True)
class Traffic:
    parts: tuple[ArrivalConfig, ...]
    trace_path: str | None = None

    @classmethod
    def parse(cls, spec: str) -> Traffic:
        if spec.startswith("trace:"):
            path, _, rest = spec[len("trace:") :].partition(",")
            speedup = float(rest.split("=", 1)[1]) if rest.startswith("speedup=") else 1.0
            return cls((ArrivalConfig("trace", trace_speedup=speedup),), path)
        return cls(tuple(ArrivalConfig.parse(p) for p in spec.split("+")))

    def times(self, seed: int, end_s: float) -> np.ndarray:
        """Every arrival before end_s, sorted (seconds from the start)."""
        if self.trace_path is not None:
            speedup = self.parts[0].trace_speedup
            it: Iterator[float] = bench_arrivals.trace(trace_times(self.trace_path), speedup)
        else:
            streams = [bench_arrivals.arrivals(p, seed + i) for i, p in enumerate(self.parts)]
            it = heapq.merge(*streams)
        return np.fromiter(itertools.takewhile(lambda t: t < end_s, it), dtype=float)

    def expected(self, end_s: float) -> float:
        """About how many arrivals before end_s (a trace: unknown, taken as small)."""
        if self.trace_path is not None:
            return 0.0
        return sum(_mean_rate(p) * end_s for p in self.parts)

    def counts(self, seed: int, end_s: float, step_s: float) -> np.ndarray:
        """Arrivals per step of step_s over [0, end_s)."""
        n = math.ceil(end_s / step_s - 1e-9)
        edges = np.arange(n + 1) * step_s
        if self.trace_path is not None or self.expected(end_s) <= MAX_DRAWN:
            return np.histogram(self.times(seed, end_s), edges)[0].astype(float)
        rng = np.random.default_rng([seed, 7])
        total = np.zeros(n)
        mids = edges[:-1] + step_s / 2
        for i, p in enumerate(self.parts):
            if p.kind in RATE_KINDS:
                rate = np.array([bench_arrivals.rate_at(p, float(t)) or 0.0 for t in mids])
                total += rng.poisson(rate * step_s)
            else:
                sub = Traffic((p,))
                total += np.histogram(sub.times(seed + i, end_s), edges)[0]
        return total


def _mean_rate(p: ArrivalConfig) -> float:
    if p.kind == "sinusoid":
        return (p.base_rps + p.peak_rps) / 2
    if p.kind == "step":
        return max(r for _, r in p.steps)
    return p.peak
