"""Arrival-rate forecast: Holt's linear trend (double exponential smoothing), so that a ramp of
traffic starts replicas before the queue shows it: a replica takes its start time to help."""

from __future__ import annotations


class HoltForecaster:
    """Level and trend (per second) of a rate observed at irregular times."""

    def __init__(self, alpha: float, beta: float) -> None:
        self.alpha = alpha
        self.beta = beta
        self.level: float | None = None
        self.trend = 0.0  # change of the rate per second
        self._last_s: float | None = None

    def update(self, now_s: float, rate: float) -> None:
        if self.level is None or self._last_s is None:
            self.level, self._last_s = rate, now_s
            return
        dt = now_s - self._last_s
        if dt <= 0:
            return
        previous = self.level
        self.level = self.alpha * rate + (1 - self.alpha) * (previous + self.trend * dt)
        self.trend = self.beta * (self.level - previous) / dt + (1 - self.beta) * self.trend
        self._last_s = now_s

    @property
    def last_s(self) -> float | None:
        """When it last took a rate (None before any)."""
        return self._last_s

    def predict(self, horizon_s: float) -> float | None:
        """The rate `horizon_s` from the last observation (never below 0); None before any."""
        if self.level is None:
            return None
        return max(0.0, self.level + self.trend * horizon_s)
