"""The capacity search and the replica count, on plain data."""

from __future__ import annotations

from surge.bench.sweep import capacity_of, next_rate, replicas_needed


def search(capacity_rps: float, **kw: float) -> list[tuple[float, bool]]:
    """Drive next_rate against a server that holds every rate up to capacity_rps."""
    history: list[tuple[float, bool]] = []
    while (rate := next_rate(history, **kw)) is not None:  # type: ignore[arg-type]
        history.append((rate, rate <= capacity_rps))
    return history


def test_doubling_then_bisection() -> None:
    history = search(13.0, start_rps=1.0, max_bisections=3)
    assert [r for r, _ in history] == [1, 2, 4, 8, 16, 12, 14, 13]
    assert capacity_of(history) == 13


def test_bisection_stops_within_tolerance() -> None:
    history = search(10.0, start_rps=1.0, max_bisections=50)
    assert 16 in [r for r, _ in history]
    assert 0.95 * 10 <= capacity_of(history) <= 10  # rel_tol 5% of the bracket's top


def test_first_rate_failing_bisects_down_and_max_rate_caps() -> None:
    history = search(0.3, start_rps=1.0, max_bisections=2)
    assert [r for r, _ in history] == [1, 0.5, 0.25]
    assert capacity_of(history) == 0.25
    capped = search(100.0, start_rps=1.0, max_rps=5.0)
    assert [r for r, _ in capped] == [1, 2, 4, 5]
    assert capacity_of(capped) == 5
    assert capacity_of([(1.0, False)]) == 0


def test_replicas_needed() -> None:
    assert replicas_needed(20, 0.2, 3) == 8  # ceil(24 / 3) = 8 exactly, not 9
    assert replicas_needed(10, 0.0, 5) == 2
    assert replicas_needed(10, 0.2, 5) == 3
    assert replicas_needed(0.1, 0.0, 5) == 1
    assert replicas_needed(10, 0.2, 0) is None
