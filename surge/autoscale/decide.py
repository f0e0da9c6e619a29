"""The replica count the signals ask for (pure), and the stabilization that keeps it from
flapping. No I/O and no clock of its own: the controller passes the time in."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.signals import Signals


@dataclass(frozen=True, slots=True)
class Decision:
    desired: int  # within min..max
    reason: str  # the signal that asked for the most replicas, with its figures
    wants: dict[str, int]  # replicas each signal asks for


def _replicas_for(total: float, target_per_replica: float, current: int, tolerance: float) -> int:
    """HPA's rule: ceil(total / target), except within `tolerance` of the current count's target,
    where it stays put (a load at 95% of target is no reason to move)."""
    ratio = total / (target_per_replica * current)
    if abs(ratio - 1.0) <= tolerance:
        return current
    return math.ceil(total / target_per_replica - 1e-9)


def desired_replicas(
    signals: Signals, config: AutoscalerConfig, forecast_rps: float | None, current: int
) -> Decision:
    """Replicas wanted now. `current`: replicas ready or starting (what the fleet will be)."""
    current = max(current, 1)
    ready = max(signals.replicas, 1)
    wants: dict[str, int] = {}
    figures: dict[str, str] = {}
    wants["ongoing"] = _replicas_for(
        signals.ongoing, config.target_ongoing_per_replica, ready, config.tolerance
    )
    figures["ongoing"] = f"{signals.ongoing:g} running+waiting"
    # A queue asks for more replicas; an empty one asks for none (the others decide the floor).
    wants["queue"] = math.ceil(signals.waiting / config.target_waiting_per_replica - 1e-9)
    figures["queue"] = f"{signals.waiting:g} waiting"
    wants["kv"] = _replicas_for(
        signals.kv_usage * ready, config.target_kv_usage, ready, config.tolerance
    )
    figures["kv"] = f"KV {signals.kv_usage:.0%}"
    if forecast_rps is not None and signals.mean_latency_s is not None:
        # Little's law: requests in the system = arrival rate x time each spends in it.
        expected = forecast_rps * signals.mean_latency_s
        wants["forecast"] = math.ceil(expected / config.target_ongoing_per_replica - 1e-9)
        figures["forecast"] = (
            f"{forecast_rps:.2f} req/s forecast x {signals.mean_latency_s:.1f} s = "
            f"{expected:.1f} ongoing"
        )
    signal = max(wants, key=lambda k: wants[k])
    desired = min(max(wants[signal], config.min_replicas), config.max_replicas)
    return Decision(desired, f"{signal}: {figures[signal]}", wants)


class Stabilizer:
    """Scale up to the lowest recommendation of the up window (a blip does not start a
    replica), down to the highest of the down window (a lull does not drain one), and by at most
    the configured steps: Kubernetes HPA's behaviour."""

    def __init__(self, config: AutoscalerConfig) -> None:
        self.config = config
        self._history: deque[tuple[float, int]] = deque()
        self._first_s: float | None = None

    def note(self, now_s: float, replicas: int) -> None:
        """Count `replicas` as recommended at `now_s`: a replica that has just become ready is
        not drained before a whole down window has seen the fleet without it (it may not even
        have had its first request yet)."""
        self._history.append((now_s, replicas))
        if self._first_s is None:
            self._first_s = now_s

    def recommend(self, now_s: float, desired: int, current: int) -> int:
        cfg = self.config
        self._history.append((now_s, desired))
        if self._first_s is None:
            self._first_s = now_s
        keep = max(cfg.scale_up_window_s, cfg.scale_down_window_s)
        while self._history and self._history[0][0] < now_s - keep:
            self._history.popleft()
        if desired > current:
            window = [d for t, d in self._history if t >= now_s - cfg.scale_up_window_s]
            return min(max(current, min(window)), current + cfg.max_scale_up_step)
        if desired < current:
            if now_s - self._first_s < cfg.scale_down_window_s:
                return current  # not a whole window seen yet: it may hold higher ones
            window = [d for t, d in self._history if t >= now_s - cfg.scale_down_window_s]
            return max(min(current, max(window)), current - cfg.max_scale_down_step)
        return current
