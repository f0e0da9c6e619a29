"""The replica count the signals ask for (pure), and the stabilization that keeps it from
flapping. No I/O and no clock of its own: the controller passes the time in."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.signals import BatchSignals, Signals


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


def batch_replicas(
    batch: BatchSignals,
    ongoing: float,
    ready: int,
    config: AutoscalerConfig,
    line_s: float | None = None,
) -> tuple[int, str]:
    """Replicas the batch work needs to finish within its window, or 0 (asks for none).

    Its lines run in what interactive traffic leaves, so a backlog alone is no reason to scale.
    Little's law sizes what it needs: finishing `remaining` lines `batch_margin_s` before the
    window closes (or half-way to it, when later than that) takes remaining / time left lines a
    second, so that many times a line's time in an engine (in flight / completed per second)
    lines in flight; with the interactive requests, sequences to hold at
    `target_ongoing_per_replica` a replica. Where the leftover
    already holds them it asks for no more than the replicas there are (and keeps those the
    batch's pace needs: the valleys do not drain the replicas it runs on); where it would miss
    its window, the replicas that finish it in time. `line_s`: a line's time as measured over
    a window (BatchJudge), else from these signals; none known and no line running: room for
    one line. All the remaining lines are held to the nearest deadline (the safe side for
    several)."""
    remaining = batch.remaining
    if remaining <= 0 or batch.window_left_s <= 0:
        return 0, "no batch"
    target = config.target_ongoing_per_replica
    if line_s is None and batch.lines_per_s > 0 and batch.in_flight > 0:
        line_s = batch.in_flight / batch.lines_per_s
    if line_s is None:
        if batch.in_flight > 0:
            return 0, f"{remaining:g} batch lines, none completed yet: no pace to judge"
        # Lines wait and none runs: interactive traffic leaves the batch no room (no tolerance
        # here: a fleet at its target is what leaves none).
        want = math.ceil((ongoing + 1) / target - 1e-9)
        return want, f"{remaining:g} batch lines waiting, none running"
    # Within twice the margin of the end (late), it aims at half the time left.
    left, margin = batch.window_left_s, config.batch_margin_s
    time_left = left - margin if left > 2 * margin else left / 2
    needed = remaining / time_left  # lines/s to finish in time
    slots = needed * line_s
    want = _replicas_for(ongoing + slots, target, ready, config.tolerance)
    return want, (
        f"{remaining:g} batch lines in {batch.window_left_s:.0f} s: {needed:.2f}/s x "
        f"{line_s:.1f} s = {slots:.1f} in flight"
    )


class BatchJudge:
    """The batch signal over time: a line's time measured over `batch_window_s` (the lines in
    flight averaged over it, as the completion rate is over the servers' recent window: one
    scrape's count against a minute's rate would tell a line's time from a moment's churn) and
    remembered from when lines ran; and a call for more replicas counted only once it has lasted
    that window (HPA's up window, for this signal alone: a batch that has just begun, or a fleet
    that has just changed, shows a pace measured on few lines)."""

    def __init__(self, config: AutoscalerConfig) -> None:
        self.config = config
        self._line_s: float | None = None
        self._wants: deque[tuple[float, int]] = deque()
        self._in_flight: deque[tuple[float, float]] = deque()
        self._since_s: float | None = None  # when the batch work began

    def want(self, now_s: float, signals: Signals) -> tuple[int, str]:
        batch = signals.batch
        if batch.remaining <= 0 or batch.window_left_s <= 0:
            self._wants.clear()
            self._in_flight.clear()
            self._line_s = self._since_s = None
            return 0, "no batch"
        if self._since_s is None:
            self._since_s = now_s
        window = self.config.batch_window_s
        self._in_flight.append((now_s, batch.in_flight))
        while self._in_flight[0][0] < now_s - window:
            self._in_flight.popleft()
        in_flight = sum(n for _, n in self._in_flight) / len(self._in_flight)
        if batch.lines_per_s > 0 and in_flight > 0:
            self._line_s = in_flight / batch.lines_per_s
        ready = max(signals.replicas, 1)
        want, why = batch_replicas(batch, signals.ongoing, ready, self.config, self._line_s)
        self._wants.append((now_s, want))
        while self._wants and self._wants[0][0] < now_s - window:
            self._wants.popleft()
        if now_s - self._since_s < window:
            return 0, f"batch begun {now_s - self._since_s:.0f} s ago: judged after {window:g} s"
        held = min(w for _, w in self._wants)
        return held, why if held == want else f"{why}; held at {held} (lower within {window:g} s)"


def desired_replicas(
    signals: Signals,
    config: AutoscalerConfig,
    forecast_rps: float | None,
    current: int,
    batch: tuple[int, str] | None = None,
) -> Decision:
    """Replicas wanted now. `current`: replicas ready or starting (what the fleet will be).
    `batch`: the batch signal's want, from a BatchJudge (None: from these signals alone)."""
    current = max(current, 1)
    ready = max(signals.replicas, 1)
    wants: dict[str, int] = {}
    figures: dict[str, str] = {}
    # Interactive load only: batch lines in the engines are not load to scale for.
    wants["ongoing"] = _replicas_for(
        signals.ongoing, config.target_ongoing_per_replica, ready, config.tolerance
    )
    figures["ongoing"] = f"{signals.ongoing:g} running+waiting"
    # A queue asks for more replicas; an empty one asks for none (the others decide the floor).
    waiting = signals.interactive_waiting
    wants["queue"] = math.ceil(waiting / config.target_waiting_per_replica - 1e-9)
    figures["queue"] = f"{waiting:g} waiting"
    # KV held by batch lines is theirs, taken back on preemption: the interactive share counts.
    total = signals.waiting + signals.running
    kv = signals.kv_usage * (signals.ongoing / total if total > 0 else 1.0)
    wants["kv"] = _replicas_for(kv * ready, config.target_kv_usage, ready, config.tolerance)
    figures["kv"] = f"KV {kv:.0%}"
    if batch is None:
        batch = batch_replicas(signals.batch, signals.ongoing, ready, config)
    wants["batch"], figures["batch"] = batch
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
    the configured steps, or percents, per scale period (per decision with no period):
    Kubernetes HPA's behaviour (its stabilization windows and rate policies, selectPolicy Max).
    A change recommended counts as made (the callers make it, but for a scale-down held back
    while replicas start, which the period then counts as spent)."""

    def __init__(self, config: AutoscalerConfig) -> None:
        self.config = config
        self._history: deque[tuple[float, int]] = deque()
        self._first_s: float | None = None
        self._changes: deque[tuple[float, int]] = deque()  # (time, replicas added or removed)

    def _period_start(self, now_s: float, current: int) -> int:
        """The count before this scale period's changes (HPA's replicas at the period's start:
        the current count less what its scale events added, plus what they removed)."""
        changes = self._changes
        while changes and changes[0][0] <= now_s - self.config.scale_period_s:
            changes.popleft()
        return current - sum(d for _, d in changes)

    def recommend(self, now_s: float, desired: int, current: int) -> int:
        target = self._recommend(now_s, desired, current)
        if target != current:
            self._changes.append((now_s, target - current))
        return target

    def note(self, now_s: float, replicas: int) -> None:
        """Count `replicas` as recommended at `now_s`: a replica that has just become ready is
        not drained before a whole down window has seen the fleet without it (it may not even
        have had its first request yet)."""
        self._history.append((now_s, replicas))
        if self._first_s is None:
            self._first_s = now_s

    def _recommend(self, now_s: float, desired: int, current: int) -> int:
        cfg = self.config
        self._history.append((now_s, desired))
        if self._first_s is None:
            self._first_s = now_s
        keep = max(cfg.scale_up_window_s, cfg.scale_down_window_s)
        while self._history and self._history[0][0] < now_s - keep:
            self._history.popleft()
        start = self._period_start(now_s, current)
        if desired > current:
            window = [d for t, d in self._history if t >= now_s - cfg.scale_up_window_s]
            limit = max(
                start + cfg.max_scale_up_step,
                math.ceil(start * (1 + cfg.max_scale_up_percent / 100) - 1e-9),
            )
            return max(current, min(max(current, min(window)), limit))
        if desired < current:
            if now_s - self._first_s < cfg.scale_down_window_s:
                return current  # not a whole window seen yet: it may hold higher ones
            window = [d for t, d in self._history if t >= now_s - cfg.scale_down_window_s]
            limit = min(
                start - cfg.max_scale_down_step,
                math.floor(start * (1 - cfg.max_scale_down_percent / 100) + 1e-9),
            )
            return min(current, max(min(current, max(window)), limit))
        return current
