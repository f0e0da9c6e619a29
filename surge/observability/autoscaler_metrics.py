"""Prometheus metrics of the autoscaler: the fleet by state, what each signal asks for, the
forecast, and the scale events (KEDA and Ray Serve expose the same facts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge


class _Decision(Protocol):
    @property
    def wants(self) -> dict[str, int]: ...


class _ForecastView(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def predicted_rps(self) -> float | None: ...
    @property
    def mean_abs_error_rps(self) -> float | None: ...


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.replicas = Gauge(
            "surge_autoscaler_replicas", "Replicas by state.", ["state"], registry=reg
        )
        self.desired = Gauge(
            "surge_autoscaler_desired_replicas",
            "Replicas decided on, after stabilization.",
            registry=reg,
        )
        self.wanted = Gauge(
            "surge_autoscaler_signal_replicas",
            "Replicas each signal asks for.",
            ["signal"],
            registry=reg,
        )
        self.forecast = Gauge(
            "surge_autoscaler_forecast_rps",
            "Forecast arrivals per second at the horizon.",
            registry=reg,
        )
        self.forecaster_rps = Gauge(
            "surge_autoscaler_forecaster_rps",
            "Each forecaster's arrivals per second at the horizon (the chosen one and shadows).",
            ["forecaster"],
            registry=reg,
        )
        self.forecaster_error = Gauge(
            "surge_autoscaler_forecaster_abs_error_rps",
            "Each forecaster's mean absolute error over its last 30 checked predictions.",
            ["forecaster"],
            registry=reg,
        )
        self.events = Counter(
            "surge_autoscaler_scale_events",
            "Scale decisions, by direction.",
            ["direction"],
            registry=reg,
        )

        self.limits = Gauge(
            "surge_autoscaler_replicas_limit",
            "The configured replica bounds (min, max).",
            ["bound"],
            registry=reg,
        )
        self.history_points = Gauge(
            "surge_autoscaler_forecast_history_points",
            "Past arrival-rate points loaded from Prometheus into the forecasters at start.",
            registry=reg,
        )

    def set_history_points(self, points: int) -> None:
        self.history_points.set(points)

    def set_limits(self, min_replicas: int, max_replicas: int) -> None:
        self.limits.labels("min").set(min_replicas)
        self.limits.labels("max").set(max_replicas)

    def set_fleet(self, ready: int, starting: int, draining: int) -> None:
        for state, n in (("ready", ready), ("starting", starting), ("draining", draining)):
            self.replicas.labels(state).set(n)

    def observe(
        self,
        *,
        ready: int,
        starting: int,
        draining: int,
        desired: int,
        decision: _Decision,
        forecast_rps: float | None,
        previous: int,
    ) -> None:
        self.set_fleet(ready, starting, draining)
        self.desired.set(desired)
        for signal, n in decision.wants.items():
            self.wanted.labels(signal).set(n)
        if forecast_rps is not None:
            self.forecast.set(forecast_rps)
        if desired != previous:
            self.events.labels("up" if desired > previous else "down").inc()

    def observe_forecasts(self, views: Sequence[_ForecastView]) -> None:
        for v in views:
            if v.predicted_rps is not None:
                self.forecaster_rps.labels(v.name).set(v.predicted_rps)
            if v.mean_abs_error_rps is not None:
                self.forecaster_error.labels(v.name).set(v.mean_abs_error_rps)
