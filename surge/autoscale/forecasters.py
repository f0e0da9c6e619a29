"""One interface over the arrival-rate forecasters, chosen by name (`--forecaster`):

    holt      Holt's linear trend (forecast.py): follows a ramp, knows no cycle
    seasonal  additive Holt-Winters, period given or found by autocorrelation (seasonal.py)
    learned   a small GRU trained online (learned.py; needs torch)
    none      no forecast

Each is a pure object over (time, rate) observations with the time passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from surge.autoscale.forecast import HoltForecaster

FORECASTERS = ("holt", "seasonal", "learned", "none")


class Forecaster(Protocol):
    def update(self, now_s: float, value: float) -> None: ...

    def predict(self, now_s: float, horizon_s: float) -> float | None:
        """The rate at now_s + horizon_s; None while it cannot tell."""
        ...


class HoltAt:
    """HoltForecaster behind the common interface: its horizon counts from its last update."""

    def __init__(self, alpha: float, beta: float) -> None:
        self.holt = HoltForecaster(alpha, beta)

    def update(self, now_s: float, value: float) -> None:
        self.holt.update(now_s, value)

    def predict(self, now_s: float, horizon_s: float) -> float | None:
        last = self.holt.last_s
        since = 0.0 if last is None else max(0.0, now_s - last)
        return self.holt.predict(since + horizon_s)


@dataclass(frozen=True, slots=True)
class ForecastConfig:
    kind: str = "holt"
    alpha: float = 0.5  # holt
    beta: float = 0.3  # holt
    step_s: float = 60.0  # seasonal, learned: bin width
    period_s: float | None = None  # seasonal, learned: None = detect

    def __post_init__(self) -> None:
        if self.kind not in FORECASTERS:
            raise ValueError(f"forecaster must be one of {FORECASTERS}, got {self.kind!r}")


def make_forecaster(config: ForecastConfig) -> Forecaster | None:
    if config.kind == "holt":
        return HoltAt(config.alpha, config.beta)
    if config.kind == "seasonal":
        from surge.autoscale.seasonal import SeasonalConfig, SeasonalForecaster

        return SeasonalForecaster(SeasonalConfig(step_s=config.step_s, period_s=config.period_s))
    if config.kind == "learned":
        from surge.autoscale.learned import LearnedConfig, LearnedForecaster

        return LearnedForecaster(LearnedConfig(step_s=config.step_s, period_s=config.period_s))
    return None


def peak_ahead(
    forecaster: Forecaster, now_s: float, horizon_s: float, step_s: float
) -> float | None:
    """The highest forecast from now to now + horizon: a replica asked for now is ready only
    at the horizon, and must not be given back before the peak within it has passed."""
    points = max(1, int(horizon_s // step_s) + 1)
    values = [forecaster.predict(now_s, horizon_s * k / points) for k in range(1, points + 1)]
    known = [v for v in values if v is not None]
    return max(known) if known else None
