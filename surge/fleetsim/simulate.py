"""One simulation: the traffic drawn once, then every policy run on the same arrivals.

The forecasters first see `history_s` of the same traffic model (the days before, as a real
deployment has them in Prometheus): arrivals are drawn over history + duration, the first part
fed to each forecaster a tick at a time at negative times, the rest simulated from t = 0.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from surge.autoscale.config import AutoscalerConfig
from surge.fleetsim.batch import BatchQueue, BatchSpec
from surge.fleetsim.control import OracleForecaster, PolicyConfig, make_controller, stabilized
from surge.fleetsim.des import simulate_requests
from surge.fleetsim.fluid import simulate_fluid
from surge.fleetsim.profile import CapacityProfile
from surge.fleetsim.result import PolicyResult, RunConfig
from surge.fleetsim.traffic import MAX_REQUESTS, Traffic


@dataclass(frozen=True, slots=True)
class SimConfig:
    traffic: Traffic
    profile: CapacityProfile
    autoscaler: AutoscalerConfig
    duration_s: float
    history_s: float = 0.0
    slo_ttft_s: float | None = 2.0
    slo_tpot_s: float | None = 0.1
    policies: tuple[str, ...] = ("reactive", "keda", "holt", "seasonal", "learned", "oracle")
    mode: str = "auto"  # requests | fluid | auto (requests up to MAX_REQUESTS arrivals)
    seed: int = 0
    horizon_s: float | None = None  # None: the cold start plus a tick
    step_s: float = 60.0  # forecast bins
    period_s: float | None = None
    max_num_seqs: int | None = None  # None: the profile's highest level
    fluid_step_s: float = 1.0
    batches: tuple[BatchSpec, ...] = ()  # batch work, run in what interactive traffic leaves
    stabilizations: tuple[str, ...] = ("surge",)  # control.STABILIZATIONS: each policy under each

    def __post_init__(self) -> None:
        if self.mode not in ("requests", "fluid", "auto"):
            raise ValueError(f"mode must be requests, fluid or auto, got {self.mode!r}")
        if not self.duration_s > 0 or self.history_s < 0:
            raise ValueError("duration must be > 0 and history >= 0")
        if not self.stabilizations:
            raise ValueError("at least one stabilization")
        for name in self.stabilizations:
            stabilized(self.autoscaler, name)  # refuses an unknown one
        BatchQueue(self.batches, self.duration_s)  # refuses windows past the span


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    run: RunConfig
    mode: str
    results: dict[str, PolicyResult]
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "policies": {n: r.summary(self.run) for n, r in self.results.items()},
            "mode": self.mode,
            "duration_s": c.duration_s,
            "history_s": c.history_s,
            "slo": {"ttft_s": c.slo_ttft_s, "tpot_s": c.slo_tpot_s},
            "profile": c.profile.source,
            "cold_start_s": c.profile.start_s,
            "target_ongoing": c.autoscaler.target_ongoing_per_replica,
            "max_num_seqs": self.run.max_num_seqs,
            "replica_capacity_rps": self.run.capacity_rps,
            "elapsed_s": self.elapsed_s,
            "stabilizations": list(c.stabilizations),
            "batches": [dataclasses.asdict(b) for b in c.batches],
        }


def simulate(config: SimConfig) -> SimResult:
    t0 = time.perf_counter()
    c, prof, auto = config, config.profile, config.autoscaler
    seqs = c.max_num_seqs or int(max(prof.levels))
    target = min(auto.target_ongoing_per_replica, seqs)
    run = RunConfig(
        c.duration_s,
        c.slo_ttft_s,
        c.slo_tpot_s,
        seqs,
        prof.rps_at(target),
        batch_fill=math.floor(target),
    )
    span = c.history_s + c.duration_s
    mode = c.mode
    if mode == "auto":
        mode = "requests" if c.traffic.expected(span) <= MAX_REQUESTS else "fluid"
    tick = auto.interval_s
    step = tick if mode == "requests" else c.fluid_step_s
    times = np.empty(0)
    if mode == "requests":
        times = c.traffic.times(c.seed, span)
        counts = np.histogram(times, np.arange(0.0, span + step / 2, step))[0].astype(float)
    else:
        counts = c.traffic.counts(c.seed, span, step)
    n_hist = round(c.history_s / step)
    history, future = counts[:n_hist], counts[n_hist:]
    horizon = c.horizon_s if c.horizon_s is not None else prof.start_s + tick
    # Start with what the first minute needs (Little's law at the target), as a running fleet.
    first = float(future[: max(1, round(60 / step))].mean()) / step
    initial = math.ceil(first * prof.e2e(target) / target - 1e-9)
    initial = min(max(initial, auto.min_replicas, 1), auto.max_replicas)
    results: dict[str, PolicyResult] = {}
    for stab in c.stabilizations:
        pc = PolicyConfig(stabilized(auto, stab), horizon, c.step_s, c.period_s)
        for name in c.policies:
            key = name if len(c.stabilizations) == 1 else f"{name}@{stab}"
            oracle = OracleForecaster(future, step, 0.0, max(c.step_s, step))
            controller = make_controller(name, pc, oracle)
            controller.name = key
            if controller.forecaster is not None and len(history):
                per_tick = max(1, round(tick / step))
                for k in range(0, len(history) - per_tick + 1, per_tick):
                    rate = float(history[k : k + per_tick].sum()) / (per_tick * step)
                    controller.observe((k + per_tick) * step - c.history_s, rate)
            batch = BatchQueue(c.batches, c.duration_s) if c.batches else None
            if mode == "requests":
                measured = times[times >= c.history_s] - c.history_s
                results[key] = simulate_requests(measured, prof, controller, run, initial, batch)
            else:
                results[key] = simulate_fluid(future, step, prof, controller, run, initial, batch)
            summary = results[key].batch
            if summary is not None:
                summary["scale_ups_for_batch"] = controller.batch_scale_ups
    return SimResult(config, run, mode, results, time.perf_counter() - t0)


def with_defaults(
    auto: AutoscalerConfig,
    profile: CapacityProfile,
    slo_ttft: float | None,
    slo_tpot: float | None,
    target: float | None,
) -> AutoscalerConfig:
    """The per-replica target: the highest measured concurrency that meets the SLO."""
    level = target if target is not None else profile.max_level_within(slo_ttft, slo_tpot)
    return dataclasses.replace(auto, target_ongoing_per_replica=level)
