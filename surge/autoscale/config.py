"""AutoscalerConfig: the replica bounds, the targets per replica, and how fast to move."""

from __future__ import annotations

from dataclasses import dataclass

from surge.autoscale.forecasters import FORECASTERS


@dataclass(frozen=True, slots=True)
class AutoscalerConfig:
    """Targets are per ready replica; the most demanding signal wins (as AIBrix and KEDA with
    several triggers do). Defaults follow the field: scale up at once, scale down only after
    the recommendation has stayed lower for a window (HPA: 300 s; shorter here, since a local
    replica starts in seconds), 10% tolerance around each target (HPA)."""

    min_replicas: int = 1  # 0: scale to zero when idle, and back to one on a request
    max_replicas: int = 4
    initial_replicas: int | None = None  # None: min_replicas
    # Requests running + waiting per replica (Ray Serve's target_ongoing_requests).
    target_ongoing_per_replica: float = 16.0
    # Requests waiting per replica (KEDA on vllm:num_requests_waiting; production-stack uses 5).
    target_waiting_per_replica: float = 2.0
    target_kv_usage: float = 0.9  # mean KV cache usage of the replicas (llm-d's threshold: 0.95)
    tolerance: float = 0.1  # no change while a signal is within 10% of its target
    interval_s: float = 2.0  # between scrapes and decisions
    scale_up_window_s: float = 0.0  # scale up to the lowest recommendation of this window
    scale_down_window_s: float = 60.0  # scale down to the highest recommendation of this window
    max_scale_up_step: int = 4  # replicas added by one decision (by one scale period)
    max_scale_down_step: int = 1  # replicas drained by one decision (by one scale period)
    # HPA's rate policies: within any scale_period_s, the count moves by at most the larger of
    # the step and this percent of the count at the period's start (0: the step alone); a
    # period of 0 bounds each decision instead (the steps above, per decision).
    scale_period_s: float = 0.0
    max_scale_up_percent: float = 0.0
    max_scale_down_percent: float = 0.0
    # Batch work: its window is its SLO. Replicas are added for it only when, at the pace its
    # lines complete, it would not finish this long before its window closes (a fixed margin:
    # a share of the time left would recede with it, and the batch finish at the very end).
    batch_margin_s: float = 600.0
    batch_window_s: float = 60.0  # a batch's call for more replicas must last this long
    # Arrival forecast (Holt's linear trend on the replicas' surge:requests_received_total),
    # looked this far ahead (about a replica's start time) and turned into replicas by Little's
    # law with the replicas' recent mean latency. 0 turns the forecast off.
    forecast_horizon_s: float = 30.0
    forecast_alpha: float = 0.5  # weight of the newest rate in the level
    forecast_beta: float = 0.3  # weight of the newest slope in the trend
    # Which forecast drives the decisions: holt, seasonal (Holt-Winters), learned (a GRU) or
    # none; holt and seasonal also run in the shadow for their metrics (forecast_bank.py).
    forecaster: str = "holt"
    forecast_step_s: float = 60.0  # seasonal, learned: the bins of the history
    forecast_period_s: float | None = None  # seasonal, learned: the season; None: detected
    drain_timeout_s: float = 60.0  # a drained replica's in-flight requests get this long
    reload_grace_s: float = 2.0  # after a replica leaves the upstreams file, before its SIGTERM
    scrape_timeout_s: float = 2.0
    # Scaled to zero, how long the gateway holds a request while the first replica starts.
    activation_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0, got {self.min_replicas}")
        if self.max_replicas < 1:
            raise ValueError(f"max_replicas must be >= 1, got {self.max_replicas}")
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})"
            )
        start = self.initial_replicas
        if start is not None and not self.min_replicas <= start <= self.max_replicas:
            raise ValueError(f"initial_replicas must be in min..max, got {start}")
        for name in ("target_ongoing_per_replica", "target_waiting_per_replica", "interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.target_kv_usage <= 1:
            raise ValueError(f"target_kv_usage must be in (0, 1], got {self.target_kv_usage}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance}")
        for name in (
            "scale_up_window_s",
            "scale_down_window_s",
            "forecast_horizon_s",
            "drain_timeout_s",
            "reload_grace_s",
            "activation_timeout_s",
            "scale_period_s",
            "max_scale_up_percent",
            "batch_window_s",
            "batch_margin_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_scale_up_step < 1 or self.max_scale_down_step < 1:
            raise ValueError("max_scale_up_step and max_scale_down_step must be >= 1")
        if not 0 <= self.max_scale_down_percent <= 100:
            raise ValueError(
                f"max_scale_down_percent must be in [0, 100], got {self.max_scale_down_percent}"
            )
        for name in ("forecast_alpha", "forecast_beta"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")

        if self.forecaster not in FORECASTERS:
            raise ValueError(f"forecaster must be one of {FORECASTERS}, got {self.forecaster!r}")
        if not self.forecast_step_s > 0:
            raise ValueError(f"forecast_step_s must be > 0, got {self.forecast_step_s}")
        period = self.forecast_period_s
        if period is not None and period < 2 * self.forecast_step_s:
            raise ValueError("forecast_period_s must be at least 2 x forecast_step_s")

    @property
    def start_replicas(self) -> int:
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas
