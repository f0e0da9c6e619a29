"""Arrival processes on seeded runs with many samples: rates, gap shapes, schedules, seeds."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from surge.bench.arrivals import arrivals, rate_at, trace
from surge.bench.config import ArrivalConfig


def take(config: ArrivalConfig, n: int, seed: int = 0) -> np.ndarray:
    return np.fromiter(itertools.islice(arrivals(config, seed), n), dtype=float)


def until(config: ArrivalConfig, end_s: float, seed: int = 0) -> np.ndarray:
    return np.fromiter(itertools.takewhile(lambda t: t < end_s, arrivals(config, seed)), float)


def cv(gaps: np.ndarray) -> float:
    return float(gaps.std() / gaps.mean())


def test_constant_is_exact() -> None:
    offsets = take(ArrivalConfig("constant", rate_rps=4), 1000)
    assert offsets[:4].tolist() == [0.0, 0.25, 0.5, 0.75]
    assert np.allclose(np.diff(offsets), 0.25)


def test_poisson_has_the_rate_and_exponential_gaps() -> None:
    offsets = take(ArrivalConfig("poisson", rate_rps=5), 40_000)
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    assert gaps.mean() == pytest.approx(0.2, rel=0.02)
    assert cv(gaps) == pytest.approx(1.0, abs=0.03)
    # Exponential: P(gap > mean) = 1/e, and it is memoryless: P(gap > 2m | gap > m) = 1/e too.
    assert (gaps > 0.2).mean() == pytest.approx(math.exp(-1), abs=0.01)
    assert (gaps > 0.4).sum() / (gaps > 0.2).sum() == pytest.approx(math.exp(-1), abs=0.015)
    assert np.all(np.diff(offsets) >= 0)


@pytest.mark.parametrize("want_cv", [0.5, 2.0, 4.0])
def test_gamma_has_the_cv_asked_and_the_rate(want_cv: float) -> None:
    offsets = take(ArrivalConfig("gamma", rate_rps=10, cv=want_cv), 60_000)
    gaps = np.diff(np.concatenate([[0.0], offsets]))
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert cv(gaps) == pytest.approx(want_cv, rel=0.06)


def test_sinusoid_counts_per_phase_follow_the_rate_curve() -> None:
    base, peak, period = 2.0, 20.0, 10.0
    config = ArrivalConfig("sinusoid", base_rps=base, peak_rps=peak, period_s=period)
    num_periods = 300
    offsets = until(config, num_periods * period)
    bins = 10
    counts = np.bincount(((offsets % period) / period * bins).astype(int), minlength=bins)
    for i in range(bins):
        grid = np.linspace(i * period / bins, (i + 1) * period / bins, 201)
        mean_rate = np.mean([rate_at(config, float(t)) for t in grid])
        expected = num_periods * mean_rate * period / bins
        assert counts[i] == pytest.approx(expected, rel=0.08), (i, counts[i], expected)
    assert rate_at(config, 0.0) == pytest.approx((base + peak) / 2)
    assert rate_at(config, period / 4) == pytest.approx(peak)
    assert rate_at(config, 3 * period / 4) == pytest.approx(base)


def test_sinusoid_rate_is_never_negative() -> None:
    config = ArrivalConfig("sinusoid", base_rps=0.0, peak_rps=5.0, period_s=4.0)
    assert min(rate_at(config, t / 10) or 0.0 for t in range(100)) >= 0
    with pytest.raises(ValueError, match="never negative"):
        ArrivalConfig("sinusoid", base_rps=-1.0, peak_rps=5.0)


def test_pulse_sends_bursts_of_n_at_the_period() -> None:
    offsets = take(ArrivalConfig("pulse", burst_size=5, period_s=2.0), 15)
    assert offsets.tolist() == [0.0] * 5 + [2.0] * 5 + [4.0] * 5


def test_pulse_with_a_base_rate_adds_poisson_between_bursts() -> None:
    config = ArrivalConfig("pulse", burst_size=8, period_s=5.0, base_rps=3.0)
    offsets = until(config, 5000.0)
    on_burst = np.isclose(offsets % 5.0, 0.0)
    assert on_burst.sum() == 8 * 1000  # bursts at 0, 5, ..., 4995
    between = offsets[~on_burst]
    assert len(between) / 5000.0 == pytest.approx(3.0, rel=0.04)
    assert np.all(np.diff(offsets) >= 0)


def test_step_rate_per_segment() -> None:
    config = ArrivalConfig("step", steps=((0, 2.0), (300, 8.0), (600, 0.0), (700, 4.0)))
    offsets = until(config, 1000.0)
    for lo, hi, rate in ((0, 300, 2.0), (300, 600, 8.0), (700, 1000, 4.0)):
        n = ((offsets >= lo) & (offsets < hi)).sum()
        assert n / (hi - lo) == pytest.approx(rate, rel=0.1), (lo, n)
    assert not ((offsets >= 600) & (offsets < 700)).any()  # a rate-0 step sends nothing
    assert rate_at(config, 299.9) == 2.0 and rate_at(config, 300.0) == 8.0


def test_step_ending_at_rate_zero_ends() -> None:
    offsets = list(arrivals(ArrivalConfig("step", steps=((0, 50.0), (10, 0.0))), 0))
    assert all(t < 10 for t in offsets)
    assert len(offsets) == pytest.approx(500, rel=0.15)


def test_trace_replay_reproduces_the_times() -> None:
    times = [0.0, 0.5, 0.5, 1.25, 7.0]
    assert list(trace(times)) == times
    assert list(trace([2.0, 0.0, 1.0], speedup=2.0)) == [0.0, 0.5, 1.0]
    with pytest.raises(ValueError, match="trace"):
        arrivals(ArrivalConfig("trace"), 0)


STOCHASTIC = [
    ArrivalConfig("poisson", rate_rps=3),
    ArrivalConfig("gamma", rate_rps=3, cv=2),
    ArrivalConfig("sinusoid", base_rps=1, peak_rps=9, period_s=5),
    ArrivalConfig("pulse", burst_size=3, period_s=2, base_rps=1),
    ArrivalConfig("step", steps=((0, 2.0), (5, 6.0))),
]


@pytest.mark.parametrize("config", STOCHASTIC, ids=lambda c: c.kind)
def test_same_seed_same_arrivals_other_seed_other(config: ArrivalConfig) -> None:
    a, b, c = take(config, 200, seed=7), take(config, 200, seed=7), take(config, 200, seed=8)
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist()
