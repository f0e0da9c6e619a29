"""The decision side of a simulated fleet: each policy is the autoscaler's own code,
`desired_replicas`, `BatchJudge` and `Stabilizer` (surge/autoscale/decide.py) with one of its
forecasters, not a copy; the simulator only hands them Signals and the time.

    reactive  the ongoing and queue signals, no forecast (Surge with --forecast-horizon 0)
    keda      the queue signal alone: ceil(waiting / target), as a KEDA ScaledObject on
              vllm:num_requests_waiting does
    holt, seasonal, learned   reactive + that forecaster, looked --forecast-horizon ahead
    oracle    reactive + the true future arrival rate (the bound a forecast can reach)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.decide import BatchJudge, Decision, Stabilizer, desired_replicas
from surge.autoscale.forecasters import ForecastConfig, Forecaster, make_forecaster, peak_ahead
from surge.autoscale.signals import Signals

POLICIES = ("reactive", "keda", "holt", "seasonal", "learned", "oracle")
# How each policy's count may move (the Stabilizer's settings):
#   surge  as the flags set them (the autoscaler's defaults: down after 60 s, +4/-1 a decision)
#   hpa    Kubernetes HPA's default behavior: down to the highest recommendation of 300 s, by
#          up to 100% of the count per 15 s; up at once, by max(4 replicas, 100%) per 15 s
#   hpa-pods  HPA's 300 s down window with Pods policies: +4 and -1 replicas per 15 s
#   none   no window and no step: each decision's count as it is
STABILIZATIONS = ("surge", "hpa", "hpa-pods", "none")


def stabilized(auto: AutoscalerConfig, name: str) -> AutoscalerConfig:
    if name == "surge":
        return auto
    if name in ("hpa", "hpa-pods"):
        # HPA's 300 s down window, 15 s periods and Pods steps; "hpa" adds its 100% policies
        # (the larger of the two applies), "hpa-pods" keeps the Pods steps alone.
        percent = 100.0 if name == "hpa" else 0.0
        return dataclasses.replace(
            auto,
            scale_up_window_s=0.0,
            scale_down_window_s=300.0,
            scale_period_s=15.0,
            max_scale_up_step=4,
            max_scale_up_percent=percent,
            max_scale_down_step=1,
            max_scale_down_percent=percent,
        )
    if name == "none":
        return dataclasses.replace(
            auto,
            scale_up_window_s=0.0,
            scale_down_window_s=0.0,
            scale_period_s=0.0,
            max_scale_up_step=auto.max_replicas,
            max_scale_down_step=auto.max_replicas,
        )
    raise ValueError(f"stabilization must be one of {STABILIZATIONS}, got {name!r}")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    autoscaler: AutoscalerConfig
    horizon_s: float = 30.0  # forecast: seconds ahead (a replica's start time and a tick)
    step_s: float = 60.0  # seasonal and learned: bin width; the oracle's smoothing
    period_s: float | None = None  # seasonal and learned: None = detected


class OracleForecaster:
    """The true future: the mean arrival rate over the step_s before now + horizon, read from
    the arrival counts the simulation will see (counts[i]: arrivals in [i dt, (i+1) dt))."""

    def __init__(self, counts: np.ndarray, dt_s: float, t0_s: float, window_s: float) -> None:
        self.cum = np.concatenate([[0.0], np.cumsum(counts)])
        self.dt_s, self.t0_s, self.window_s = dt_s, t0_s, window_s

    def update(self, now_s: float, value: float) -> None:
        pass

    def predict(self, now_s: float, horizon_s: float) -> float | None:
        end = now_s + horizon_s - self.t0_s
        i = int(np.clip(end // self.dt_s, 0, len(self.cum) - 1))
        j = int(np.clip((end - self.window_s) // self.dt_s, 0, len(self.cum) - 1))
        return float(self.cum[i] - self.cum[j]) / max(self.dt_s, (i - j) * self.dt_s)


class Controller:
    def __init__(self, name: str, config: PolicyConfig, forecaster: Forecaster | None) -> None:
        self.name = name
        self.config = config
        self.autoscaler = config.autoscaler
        self.forecaster = forecaster
        self.stabilizer = Stabilizer(self.autoscaler)
        self.batch = BatchJudge(self.autoscaler)
        self.last_forecast: float | None = None
        self.batch_scale_ups = 0  # decisions the batch signal alone made larger

    def observe(self, now_s: float, arrival_rps: float) -> None:
        """History (before the simulated span), or the arrival rate seen at a tick."""
        if self.forecaster is not None:
            self.forecaster.update(now_s, arrival_rps)

    def decide(self, now_s: float, signals: Signals, current: int) -> tuple[int, Decision]:
        forecast = None
        if self.forecaster is not None and signals.arrival_rps is not None:
            self.forecaster.update(now_s, signals.arrival_rps)
            c = self.config
            forecast = peak_ahead(self.forecaster, now_s, c.horizon_s, min(c.step_s, c.horizon_s))
        self.last_forecast = forecast
        batch = self.batch.want(now_s, signals)
        decision = desired_replicas(signals, self.autoscaler, forecast, current, batch)
        target = self.stabilizer.recommend(now_s, decision.desired, current)
        others = max(n for k, n in decision.wants.items() if k != "batch")
        if target > current and target > others:
            self.batch_scale_ups += 1
        return target, decision


def make_controller(
    name: str, config: PolicyConfig, oracle: OracleForecaster | None = None
) -> Controller:
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {name!r}")
    if name == "keda":
        # Only the queue counts: the ongoing signal's target so high it never asks for more.
        queue_only = dataclasses.replace(config.autoscaler, target_ongoing_per_replica=1e12)
        return Controller(name, dataclasses.replace(config, autoscaler=queue_only), None)
    if name == "reactive":
        return Controller(name, config, None)
    if name == "oracle":
        if oracle is None:
            raise ValueError("the oracle needs the arrival counts")
        return Controller(name, config, oracle)
    kind = name
    fc = ForecastConfig(kind, step_s=config.step_s, period_s=config.period_s)
    return Controller(name, config, make_forecaster(fc))
