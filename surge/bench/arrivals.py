"""Open-loop arrival processes: pure, seeded generators of send offsets (seconds from the start).

Every generator is an infinite (or, for a schedule that ends at rate 0 or a trace, finite)
non-decreasing iterator; the driver stops it at the request count or the duration. Time-varying
rates are non-homogeneous Poisson processes: the sinusoid by thinning (Lewis & Shedler: candidates
at the peak rate, each kept with probability rate(t) / peak), the step schedule by inverting its
cumulative rate (unit-rate Poisson times E_k mapped through Lambda^-1, exact for piecewise-constant
rates).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence

import numpy as np

from surge.bench.config import ArrivalConfig


def arrivals(config: ArrivalConfig, seed: int) -> Iterator[float]:
    """Send offsets of `config`'s process; the same seed gives the same offsets."""
    rng = np.random.default_rng([seed, 0])  # stream 0: arrivals; workloads draw from stream 1
    if config.kind == "constant":
        return constant(config.rate_rps)
    if config.kind == "poisson":
        return gamma(config.rate_rps, 1.0, rng)
    if config.kind == "gamma":
        return gamma(config.rate_rps, config.cv, rng)
    if config.kind == "sinusoid":
        return sinusoid(config.base_rps, config.peak_rps, config.period_s, rng)
    if config.kind == "pulse":
        return pulse(config.burst_size, config.period_s, config.base_rps, rng)
    if config.kind == "step":
        return step(config.steps, rng)
    raise ValueError("trace arrivals come from the trace file: use trace(times, speedup)")


def rate_at(config: ArrivalConfig, t_s: float) -> float | None:
    """The model's instantaneous rate at t_s (requests/s), or None where it has none (a trace)."""
    if config.kind in ("constant", "poisson", "gamma"):
        return config.rate_rps
    if config.kind == "sinusoid":
        return sinusoid_rate(config.base_rps, config.peak_rps, config.period_s, t_s)
    if config.kind == "pulse":
        return config.base_rps + config.burst_size / config.period_s  # mean over a period
    if config.kind == "step":
        return next(r for s, r in reversed(config.steps) if s <= t_s)
    return None


def constant(rate_rps: float) -> Iterator[float]:
    k = 0
    while True:
        yield k / rate_rps
        k += 1


def gamma(rate_rps: float, cv: float, rng: np.random.Generator) -> Iterator[float]:
    """Renewal process with gamma gaps: shape 1/cv^2, scale cv^2/rate (mean 1/rate, CV cv)."""
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate_rps * shape)
    t = 0.0
    while True:
        # Draw in blocks: one numpy call per gap would dominate for high rates.
        for gap in rng.gamma(shape, scale, size=1024):
            t += float(gap)
            yield t


def sinusoid_rate(base_rps: float, peak_rps: float, period_s: float, t_s: float) -> float:
    return base_rps + (peak_rps - base_rps) * (1 + math.sin(2 * math.pi * t_s / period_s)) / 2


def sinusoid(
    base_rps: float, peak_rps: float, period_s: float, rng: np.random.Generator
) -> Iterator[float]:
    top = max(base_rps, peak_rps)
    for t in gamma(top, 1.0, rng):
        if rng.random() * top < sinusoid_rate(base_rps, peak_rps, period_s, t):
            yield t


def pulse(
    burst_size: int, period_s: float, base_rps: float, rng: np.random.Generator
) -> Iterator[float]:
    """burst_size arrivals at t = 0, period_s, 2 period_s, ...; Poisson at base_rps besides."""

    def bursts() -> Iterator[float]:
        k = 0
        while True:
            for _ in range(burst_size):
                yield k * period_s
            k += 1

    if base_rps <= 0:
        return bursts()
    return heapq.merge(bursts(), gamma(base_rps, 1.0, rng))


def step(steps: Sequence[tuple[float, float]], rng: np.random.Generator) -> Iterator[float]:
    """Poisson with rate steps[i][1] from steps[i][0] on; ends if the last rate is 0."""
    starts = [s for s, _ in steps]
    rates = [r for _, r in steps]
    # cum[i] = Lambda(starts[i]): expected arrivals before segment i
    cum = [0.0]
    for i in range(1, len(steps)):
        cum.append(cum[-1] + rates[i - 1] * (starts[i] - starts[i - 1]))
    i, target = 0, 0.0
    while True:
        target += float(rng.exponential())
        while i + 1 < len(steps) and cum[i + 1] <= target:
            i += 1
        if rates[i] <= 0:  # only possible in the last segment: no more arrivals, ever
            return
        yield starts[i] + (target - cum[i]) / rates[i]


def trace(times_s: Sequence[float], speedup: float = 1.0) -> Iterator[float]:
    """A trace's arrival times, sorted and divided by `speedup` (2 = twice as fast)."""
    for t in sorted(times_s):
        yield t / speedup
