"""Health tracking from probes and from real traffic, on a driven clock."""

from __future__ import annotations

from surge.gateway.config import HealthConfig
from surge.gateway.health import HealthTracker


def test_probes_take_out_and_bring_back_with_thresholds() -> None:
    h = HealthTracker(HealthConfig(healthy_threshold=2, unhealthy_threshold=3))
    h.on_probe(False, 0)
    h.on_probe(False, 1)
    assert h.is_healthy(1)
    h.on_probe(False, 2)
    assert not h.is_healthy(2) and h.reason == "probe"
    h.on_probe(True, 3)
    h.on_probe(False, 4)  # a failure resets the success streak
    h.on_probe(True, 5)
    assert not h.is_healthy(5)
    h.on_probe(True, 6)
    assert h.is_healthy(6)


def test_consecutive_traffic_failures_eject_until_probes_recover() -> None:
    h = HealthTracker(HealthConfig(outlier_failures=3, healthy_threshold=2))
    for _ in range(10):
        h.on_probe(True, 0)  # a long healthy record ...
    h.on_traffic(False, 1)
    h.on_traffic(False, 1)
    h.on_traffic(True, 1)  # interrupted: the streak restarts
    h.on_traffic(False, 2)
    h.on_traffic(False, 2)
    assert h.is_healthy(2)
    h.on_traffic(False, 2)
    assert not h.is_healthy(2) and h.reason == "outlier"
    h.on_traffic(True, 3)  # a straggler finishing does not bring it back
    h.on_probe(True, 4)  # ... counts for nothing: recovery needs fresh probes
    assert not h.is_healthy(4)
    h.on_probe(True, 5)
    assert h.is_healthy(5)


def test_without_probes_an_outlier_returns_after_eject_time() -> None:
    h = HealthTracker(HealthConfig(interval_s=0, outlier_failures=1, eject_s=10))
    h.on_traffic(False, 100)
    assert not h.is_healthy(109.9)
    assert h.is_healthy(110)
