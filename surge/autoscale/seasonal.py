"""Holt-Winters with additive seasonality over a rate sampled at irregular times, and the period
found by autocorrelation when it is not given.

Hand-rolled rather than statsmodels' ExponentialSmoothing: the autoscaler updates once per tick
and predicts at once, which is O(1) here, while statsmodels refits the whole history (an
optimizer run per call, seconds on a day of samples) and would bring scipy and pandas along.

Observations are averaged into bins of `step_s`; each closed bin is one Holt-Winters step:

    level_t  = a (x_t - s_{t-m}) + (1 - a)(level + trend)
    trend_t  = b (level_t - level_{t-1}) + (1 - b) trend
    s_t      = g (x_t - level_t) + (1 - g) s_{t-m}
    x^_{t+h} = level_t + h trend_t + s_{t+h-m}

(m = period_s / step_s bins). Until a period is known it is Holt's linear trend (no season).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surge.autoscale.rate_bins import RateBins


@dataclass(frozen=True, slots=True)
class SeasonalConfig:
    step_s: float = 60.0  # bin width
    period_s: float | None = None  # None: detect from the history
    alpha: float = 0.2
    beta: float = 0.01
    gamma: float = 0.3
    min_period_s: float = 0.0  # detection: shortest lag considered (0: 4 bins)
    max_history_bins: int = 20_000  # detection looks at this many bins at most
    min_acf: float = 0.3  # detection: the peak's autocorrelation must reach this

    def __post_init__(self) -> None:
        if not self.step_s > 0:
            raise ValueError(f"step_s must be > 0, got {self.step_s}")
        if self.period_s is not None and self.period_s < 2 * self.step_s:
            raise ValueError("period_s must be at least two bins (2 * step_s)")
        for name in ("alpha", "beta", "gamma"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1]")


def detect_period(values: np.ndarray, min_lag: int = 4, min_acf: float = 0.3) -> int | None:
    """The lag (in samples) of the highest local peak of the autocorrelation of the linearly
    detrended series, among lags up to half its length; None when no peak reaches `min_acf`
    (no season worth modelling, or too short a history: two periods are needed)."""
    n = len(values)
    if n < 2 * max(min_lag, 2):
        return None
    x = values - np.polyval(np.polyfit(np.arange(n), values, 1), np.arange(n))
    x = x - x.mean()
    denom = float(np.dot(x, x))
    if denom <= 0:
        return None
    # Autocorrelation by FFT (a day of minute bins is 1440 lags: direct sums would be slow).
    f = np.fft.rfft(x, 2 * n)
    acf = np.fft.irfft(f * np.conj(f))[: n // 2 + 1] / denom
    best, best_lag = min_acf, None
    # A peak needs a lag past it: a little more than two periods of history.
    for lag in range(max(min_lag, 2), len(acf) - 1):
        if acf[lag] >= acf[lag - 1] and acf[lag] >= acf[lag + 1] and acf[lag] > best:
            best, best_lag = float(acf[lag]), lag
    return best_lag


class SeasonalForecaster:
    """Additive Holt-Winters on `step_s` bins of the observed rate."""

    def __init__(self, config: SeasonalConfig | None = None) -> None:
        self.config = config or SeasonalConfig()
        c = self.config
        self.period_bins: int | None = None if c.period_s is None else round(c.period_s / c.step_s)
        self.level: float | None = None
        self.trend = 0.0  # per bin
        self.season: np.ndarray | None = None
        self.bins = RateBins(c.step_s, c.max_history_bins)  # for detection, initialization

    @property
    def history(self) -> list[float]:
        return self.bins.history

    def update(self, now_s: float, value: float) -> None:
        self.bins.add(now_s, value, self._close)

    def _close(self, x: float, i: int) -> None:
        """Bin `x` closed; `i`: its clock bin (the season is indexed by it)."""
        c = self.config
        closed = self.bins.closed
        # Detection every n/32 bins: a fresh look often enough, FFTs of a long history rarely.
        if self.period_bins is None and closed % max(1, closed // 32) == 0:
            min_lag = max(4, round(c.min_period_s / c.step_s))
            self.period_bins = detect_period(np.asarray(self.history), min_lag, c.min_acf)
        m = self.period_bins
        if self.season is None and m is not None and len(self.history) >= 2 * m:
            self._initialize(m)
            return
        if self.level is None:
            self.level = x
            return
        s_old = 0.0 if self.season is None or m is None else float(self.season[i % m])
        previous = self.level
        self.level = c.alpha * (x - s_old) + (1 - c.alpha) * (previous + self.trend)
        self.trend = c.beta * (self.level - previous) + (1 - c.beta) * self.trend
        if self.season is not None and m is not None:
            self.season[i % m] = c.gamma * (x - self.level) + (1 - c.gamma) * s_old

    def _initialize(self, m: int) -> None:
        """Season from the whole cycles of the history: each bin's mean deviation from its
        cycle's mean; level and trend from the last two cycles' means."""
        cycles = len(self.history) // m
        h = np.asarray(self.history[len(self.history) - cycles * m :]).reshape(cycles, m)
        means = h.mean(axis=1)
        season = (h - means[:, None]).mean(axis=0)
        # Bin k of the season array is bin index k (mod m) of the clock, whatever the phase.
        first = self.bins.last_bin + 1 - cycles * m
        self.season = np.roll(season, first % m)
        self.trend = float(means[-1] - means[-2]) / m if cycles >= 2 else 0.0
        # The level at the last closed bin: the last cycle's mean, moved half a cycle on.
        self.level = float(means[-1]) + self.trend * (m - 1) / 2

    def predict(self, now_s: float, horizon_s: float) -> float | None:
        """The rate at now_s + horizon_s (never below 0); None before any observation."""
        if self.level is None:
            return self.bins.open_mean
        step = self.config.step_s
        target = int((now_s + horizon_s) // step)
        ahead = target - self.bins.last_bin  # bins past the last closed
        value = self.level + self.trend * ahead
        if self.season is not None and self.period_bins:
            value += float(self.season[target % self.period_bins])
        return max(0.0, value)

    @property
    def period_s(self) -> float | None:
        return None if self.period_bins is None else self.period_bins * self.config.step_s
