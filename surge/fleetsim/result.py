"""What one simulated policy gives: totals, and the timeline sampled at each decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class RunConfig:
    """What every policy of one simulation shares."""

    duration_s: float
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    max_num_seqs: int
    capacity_rps: float  # one replica at its target concurrency (for the capacity line)
    batch_fill: int = 0  # batch lines fill a replica up to this many sequences in all


@dataclass(slots=True)
class Timeline:
    t: list[float] = field(default_factory=list)
    demand_rps: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    starting: list[int] = field(default_factory=list)
    forecast_rps: list[float] = field(default_factory=list)  # nan: none

    def add(
        self, t: float, demand: float, ready: int, starting: int, forecast: float | None
    ) -> None:
        self.t.append(t)
        self.demand_rps.append(demand)
        self.ready.append(ready)
        self.starting.append(starting)
        self.forecast_rps.append(float("nan") if forecast is None else forecast)


@dataclass(slots=True)
class PolicyResult:
    name: str
    judged: float = 0.0  # requests (the fluid mode counts fractions)
    met: float = 0.0
    replica_s: float = 0.0
    scale_events: int = 0
    timeline: Timeline = field(default_factory=Timeline)
    batch: dict[str, Any] | None = None  # BatchQueue.summary(): None without batch work

    def summary(self, run: RunConfig) -> dict[str, Any]:
        attainment = self.met / self.judged if self.judged else None
        return {
            "slo_attainment": attainment,
            "goodput_rps": self.met / run.duration_s,
            "requests": self.judged,
            "replica_hours": self.replica_s / 3600,
            "scale_events": self.scale_events,
            "max_replicas": max(self.timeline.ready, default=0),
            "peaks": peak_leads(self.timeline, run.capacity_rps),
            "batch": self.batch,
        }


def smooth(values: np.ndarray, n: int) -> np.ndarray:
    if n <= 1 or len(values) < n:
        return values
    return np.convolve(values, np.ones(n) / n, mode="same")


def peak_leads(tl: Timeline, per_replica_rps: float) -> list[dict[str, Any]]:
    """At each peak of demand (1-minute means; the highest point within a tenth of the span on
    either side, 20% above the mean): when demand, on its way up from the trough before it,
    first reached half-way from the trough to the peak, when the ready capacity (ready replicas
    x one replica's rate at its target concurrency) first did, and the lead of capacity
    (seconds; negative: it lagged; None: it never got there)."""
    t = np.asarray(tl.t)
    if len(t) < 10:
        return []
    dt = float(t[1] - t[0])
    demand = smooth(np.asarray(tl.demand_rps), max(1, round(60 / dt)))
    capacity = np.asarray(tl.ready) * per_replica_rps
    half = max(1, len(t) // 10)
    out = []
    i = 0
    while i < len(t):
        lo, hi = max(0, i - half), min(len(t), i + half + 1)
        if demand[i] == demand[lo:hi].max() and demand[i] > demand.mean() * 1.2:
            lo2 = max(0, i - 4 * half)  # the trough before: up to 40% of the span back
            m = lo2 + int(np.argmin(demand[lo2 : i + 1]))
            mid = (demand[m] + demand[i]) / 2  # the rise's steepest part: a sharp crossing
            up = np.nonzero(demand[m : i + 1] >= mid)[0]
            j = m + int(up[0])
            reached = np.nonzero(capacity[m : i + 2 * half] >= mid)[0]
            t_cap = float(t[m + reached[0]]) if len(reached) else None  # at m: a lower bound
            out.append(
                {
                    "t_s": float(t[i]),
                    "demand_rps": float(demand[i]),
                    "mid_rps": float(mid),
                    "demand_rose_s": float(t[j]),
                    "capacity_rose_s": t_cap,
                    "lead_s": None if t_cap is None else float(t[j]) - t_cap,
                }
            )
            i = hi
        else:
            i += 1
    return out
