"""The autoscaler's decisions, pure: each signal's replica count, the bounds, the tolerance, the
forecast through Little's law, and the stabilization windows (time passed in)."""

from __future__ import annotations

import pytest

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.controller import pick_victims
from surge.autoscale.decide import Stabilizer, desired_replicas
from surge.autoscale.forecast import HoltForecaster
from surge.autoscale.providers.base import Replica
from surge.autoscale.signals import Signals

CFG = AutoscalerConfig(
    min_replicas=1, max_replicas=8, target_ongoing_per_replica=10, target_waiting_per_replica=2,
    target_kv_usage=0.8, tolerance=0.1,
)  # fmt: skip


def signals(
    replicas: int = 1,
    waiting: float = 0,
    running: float = 0,
    kv: float = 0.0,
    rps: float | None = None,
    latency: float | None = None,
) -> Signals:
    return Signals(replicas, waiting, running, kv, rps, latency)


def test_idle_fleet_shrinks_to_the_minimum() -> None:
    d = desired_replicas(signals(replicas=3), CFG, None, current=3)
    assert d.desired == 1


def test_ongoing_requests_ask_for_ceil_of_total_over_target() -> None:
    d = desired_replicas(signals(replicas=2, running=35), CFG, None, current=2)
    assert d.desired == 4 and d.reason.startswith("ongoing")


def test_within_tolerance_of_the_target_nothing_moves() -> None:
    # 2 replicas x 10 = 20 target; 21 ongoing is 5% over: stay at 2 (HPA's 10% tolerance).
    assert desired_replicas(signals(replicas=2, running=21), CFG, None, current=2).desired == 2
    assert desired_replicas(signals(replicas=2, running=23), CFG, None, current=2).desired == 3


def test_a_queue_asks_for_more_even_when_ongoing_is_modest() -> None:
    d = desired_replicas(signals(replicas=1, running=4, waiting=5), CFG, None, current=1)
    assert d.wants["queue"] == 3 and d.desired == 3 and d.reason.startswith("queue")


def test_kv_pressure_asks_for_more() -> None:
    d = desired_replicas(signals(replicas=2, running=4, kv=0.99), CFG, None, current=2)
    assert d.wants["kv"] == 3 and d.desired == 3


def test_forecast_turns_into_replicas_by_littles_law() -> None:
    # 6 req/s x 5 s each = 30 in the system; 10 per replica -> 3, before any queue shows.
    d = desired_replicas(signals(running=2, rps=1.0, latency=5.0), CFG, 6.0, current=1)
    assert d.wants["forecast"] == 3 and d.desired == 3 and "forecast" in d.reason
    # No latency measured yet: the forecast cannot be turned into replicas.
    assert "forecast" not in desired_replicas(signals(running=2), CFG, 6.0, current=1).wants


def test_the_bounds_hold() -> None:
    assert desired_replicas(signals(running=1000), CFG, None, current=1).desired == 8
    floor = AutoscalerConfig(min_replicas=2, max_replicas=3)
    assert desired_replicas(signals(replicas=3), floor, None, current=3).desired == 2


def test_stabilizer_scales_up_at_once_and_down_only_after_the_window() -> None:
    cfg = AutoscalerConfig(max_replicas=8, scale_down_window_s=10, max_scale_down_step=1)
    s = Stabilizer(cfg)
    assert s.recommend(0.0, 3, current=1) == 3  # up: no up window
    assert s.recommend(2.0, 1, current=3) == 3  # down: a whole window not seen yet
    assert s.recommend(9.0, 1, current=3) == 3  # the 3 at t=0 is still in the window
    assert s.recommend(10.5, 1, current=3) == 2  # past it: down, one step at a time
    assert s.recommend(11.0, 1, current=2) == 1


def test_stabilizer_up_window_ignores_a_blip_and_steps_are_bounded() -> None:
    cfg = AutoscalerConfig(max_replicas=8, scale_up_window_s=5, max_scale_up_step=2)
    s = Stabilizer(cfg)
    assert s.recommend(0.0, 1, current=1) == 1
    assert s.recommend(1.0, 6, current=1) == 1  # the 1 of t=0 is within the up window
    assert s.recommend(6.5, 6, current=1) == 3  # 6 for a whole window: up, by 2 at most


def test_min_zero_lets_an_idle_fleet_drain_to_nothing() -> None:
    cfg = AutoscalerConfig(min_replicas=0, max_replicas=2, scale_down_window_s=10)
    assert cfg.start_replicas == 0
    assert desired_replicas(signals(replicas=1), cfg, None, current=1).desired == 0
    # Any arrival keeps one: the forecast of a trickle asks for a replica.
    busy = desired_replicas(signals(replicas=1, rps=0.1, latency=1.0), cfg, 0.1, current=1)
    assert busy.desired == 1
    ready = [Replica(f"r{i}", f"http://h:{i}", started_s=float(i)) for i in range(2)]
    assert [r.id for r in pick_victims(ready, {}, 2)] == ["r1"]  # the default keeps one
    assert len(pick_victims(ready, {}, 2, keep=0)) == 2


def test_a_replica_just_ready_is_not_drained_within_the_window() -> None:
    cfg = AutoscalerConfig(min_replicas=0, max_replicas=2, scale_down_window_s=10)
    s = Stabilizer(cfg)
    assert s.recommend(0.0, 0, current=1) == 1  # no whole window seen yet
    assert s.recommend(11.0, 0, current=1) == 0  # idle for a window: down to zero
    s.note(30.0, 1)  # scaled from zero: a replica became ready at t=30
    assert s.recommend(30.5, 0, current=1) == 1  # its first request may not have come yet
    assert s.recommend(41.0, 0, current=1) == 0


def test_holt_follows_a_ramp_ahead() -> None:
    f = HoltForecaster(alpha=0.5, beta=0.3)
    assert f.predict(10) is None
    for t in range(0, 60, 2):
        f.update(float(t), 0.1 * t)  # the rate grows 0.1 req/s every second
    now = 58 * 0.1
    ahead = f.predict(30.0)
    assert ahead is not None and ahead > now + 2.0  # it extrapolates the trend
    flat = HoltForecaster(alpha=0.5, beta=0.3)
    for t in range(0, 60, 2):
        flat.update(float(t), 3.0)
    assert flat.predict(30.0) == pytest.approx(3.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_replicas": -1},
        {"min_replicas": 0, "max_replicas": 0},
        {"min_replicas": 3, "max_replicas": 2},
        {"initial_replicas": 9},
        {"target_kv_usage": 1.5},
        {"tolerance": 1.0},
        {"target_ongoing_per_replica": 0},
    ],
)
def test_config_refuses_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        AutoscalerConfig(**kwargs)  # type: ignore[arg-type]


def test_local_replicas_get_disjoint_cores_while_there_are_enough() -> None:
    import os
    from pathlib import Path

    from surge.autoscale.cli import cpus_per_replica
    from surge.autoscale.providers.local import LocalProcessProvider, LocalProviderConfig

    cores = sorted(os.sched_getaffinity(0))
    provider = LocalProcessProvider(LocalProviderConfig(log_dir=Path("/tmp"), cpus_per_replica=1))
    first = provider._pick_cores()
    provider._cores["a"] = first
    second = provider._pick_cores()
    assert len(first) == len(second) == 1
    if len(cores) >= 2:
        assert first != second  # a core each
    assert cpus_per_replica("0", 4) is None and cpus_per_replica("3", 4) == 3
    if not Path("/proc/driver/nvidia/gpus").is_dir():
        assert cpus_per_replica("auto", 2) == max(1, len(cores) // 2)
