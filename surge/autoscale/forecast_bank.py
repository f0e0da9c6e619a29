"""The autoscaler's forecasts: the chosen forecaster (`--forecaster`) drives the decisions; Holt
and the seasonal one also run in the shadow (both cost microseconds a tick), so that each one's
prediction and its error are exported and can be compared on the live traffic before switching.

Error: each prediction made at t for t + horizon is checked against the rate observed at the
first tick at or after t + horizon; the exported figure is the mean absolute error of the last
`window` checks (requests/s). Pure: the time is passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.forecasters import ForecastConfig, Forecaster, make_forecaster, peak_ahead


@dataclass(frozen=True, slots=True)
class ForecastView:
    name: str
    predicted_rps: float | None  # at the horizon, made this tick
    mean_abs_error_rps: float | None  # over the last checks; None before the first


class _Tracked:
    def __init__(self, name: str, forecaster: Forecaster, window: int) -> None:
        self.name = name
        self.forecaster = forecaster
        self.pending: deque[tuple[float, float]] = deque()  # (due time, predicted)
        self.errors: deque[float] = deque(maxlen=window)
        self.last: float | None = None


class ForecastBank:
    def __init__(self, config: AutoscalerConfig, window: int = 30) -> None:
        self.horizon_s = config.forecast_horizon_s
        self.step_s = config.forecast_step_s
        self.chosen = config.forecaster
        names = [self.chosen] if self.chosen not in ("none", "holt", "seasonal") else []
        self.tracked: list[_Tracked] = []
        for name in [*names, "holt", "seasonal"]:
            fc = ForecastConfig(
                name,
                config.forecast_alpha,
                config.forecast_beta,
                config.forecast_step_s,
                config.forecast_period_s,
            )
            forecaster = make_forecaster(fc)
            if forecaster is not None:
                self.tracked.append(_Tracked(name, forecaster, window))

    def update(self, now_s: float, rate: float | None) -> float | None:
        """Feed the observed arrival rate; the chosen forecaster's peak over the horizon (None:
        no forecast, or none yet)."""
        if rate is None or self.horizon_s <= 0:
            return None
        chosen = None
        for t in self.tracked:
            while t.pending and t.pending[0][0] <= now_s:
                t.errors.append(abs(t.pending.popleft()[1] - rate))
            t.forecaster.update(now_s, rate)
            t.last = t.forecaster.predict(now_s, self.horizon_s)
            if t.last is not None:
                t.pending.append((now_s + self.horizon_s, t.last))
            if t.name == self.chosen:
                step = min(self.step_s, self.horizon_s)
                chosen = peak_ahead(t.forecaster, now_s, self.horizon_s, step)
        return chosen

    def seed(self, points: Sequence[tuple[float, float]], now_s: float) -> None:
        """Past (time, rate) observations, oldest first (history.py's backfill): fed to every
        forecaster, unchecked (no prediction was made for them); then each one's prediction
        from `now_s`, so the metrics show it before the first tick."""
        for t in self.tracked:
            bulk = getattr(t.forecaster, "seed", None)  # learned: trains once, at the end
            if bulk is not None:
                bulk(points)
            else:
                for at_s, rate in points:
                    t.forecaster.update(at_s, rate)
            if points:
                t.last = t.forecaster.predict(now_s, self.horizon_s)

    def views(self) -> list[ForecastView]:
        return [
            ForecastView(t.name, t.last, sum(t.errors) / len(t.errors) if t.errors else None)
            for t in self.tracked
        ]
