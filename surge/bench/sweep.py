"""Capacity sweeps.

Rate sweep: open-loop runs of a fixed duration at rising rates. Without a list of rates, the rate
doubles from `start_rps` until SLO attainment drops below the target, then bisects between the
highest rate that held and the lowest that did not. The capacity is the highest rate that held;
given a traffic model's peak and a headroom, the replicas needed are
ceil(peak * (1 + headroom) / capacity).

Concurrency sweep: one closed-loop run per level, one row each.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from surge.bench.config import ArrivalConfig, BenchConfig
from surge.bench.drive import run
from surge.bench.metrics import Report, summarize


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One step of a sweep: its load (a rate or a concurrency) and what it achieved."""

    load: float
    report: Report
    passed: bool | None = None  # rate sweeps: attainment >= target


def next_rate(
    history: Sequence[tuple[float, bool]],
    *,
    start_rps: float,
    max_rps: float = math.inf,
    max_bisections: int = 4,
    rel_tol: float = 0.05,
) -> float | None:
    """The next rate to try after `history` (rate, held) pairs, or None when the search is done.

    Doubling until the first failure (or max_rps, tried once), then bisection between the highest
    rate that held below the lowest failure and that failure, at most `max_bisections` times or
    until the interval is within rel_tol of its top."""
    if not history:
        return min(start_rps, max_rps)
    fails = [r for r, held in history if not held]
    if not fails:
        top = max(r for r, _ in history)
        if top >= max_rps:
            return None
        return min(top * 2, max_rps)
    hi = min(fails)
    lo = max((r for r, held in history if held and r < hi), default=0.0)
    first_fail = next(i for i, (_, held) in enumerate(history) if not held)
    num_bisections = len(history) - first_fail - 1
    if num_bisections >= max_bisections or hi - lo <= rel_tol * hi:
        return None
    return (lo + hi) / 2


def capacity_of(history: Sequence[tuple[float, bool]]) -> float:
    """The highest rate that held below the lowest rate that failed (0 if none held)."""
    fails = [r for r, held in history if not held]
    hi = min(fails, default=math.inf)
    return max((r for r, held in history if held and r < hi), default=0.0)


def replicas_needed(peak_rps: float, headroom: float, capacity_rps: float) -> int | None:
    """ceil(peak * (1 + headroom) / capacity); None when nothing held (capacity 0)."""
    if capacity_rps <= 0:
        return None
    return max(1, math.ceil(peak_rps * (1 + headroom) / capacity_rps - 1e-9))


def attainment(report: Report) -> float | None:
    return None if report.goodput is None else report.goodput.fraction_met


async def rate_sweep(
    base: BenchConfig,
    *,
    target: float,
    rates: Sequence[float] = (),
    start_rps: float = 1.0,
    max_rps: float = math.inf,
    max_bisections: int = 4,
    arrival: ArrivalConfig | None = None,
    on_row: Callable[[SweepRow], None] = lambda row: None,
) -> list[SweepRow]:
    """Run open-loop steps of `base.duration_s` each. `arrival` gives the process (poisson by
    default; its rate is replaced at each step). A given list of rates is run in order up to its
    first failure."""
    if not base.slo.is_set:
        raise ValueError("a rate sweep needs an SLO (--slo)")
    if base.duration_s is None:
        raise ValueError("a rate sweep needs a duration per step")
    shape = arrival or ArrivalConfig("poisson")
    rows: list[SweepRow] = []
    history: list[tuple[float, bool]] = []
    todo = list(rates)
    while True:
        if rates:
            rate = todo.pop(0) if todo and all(h for _, h in history) else None
        else:
            rate = next_rate(
                history, start_rps=start_rps, max_rps=max_rps, max_bisections=max_bisections
            )
        if rate is None:
            return rows
        config = dataclasses.replace(
            base,
            concurrency=None,
            num_requests=None,
            arrival=dataclasses.replace(shape, rate_rps=rate),
        )
        result = await run(config)
        report = summarize(result.records, config.slo, result.duration_s)
        met = attainment(report)
        row = SweepRow(rate, report, passed=met is not None and met >= target)
        rows.append(row)
        history.append((rate, bool(row.passed)))
        on_row(row)


async def concurrency_sweep(
    base: BenchConfig,
    levels: Sequence[int],
    *,
    num_requests: int | None = None,
    requests_per_client: int = 4,
    on_row: Callable[[SweepRow], None] = lambda row: None,
) -> list[SweepRow]:
    """One closed-loop run per level of `num_requests` requests (default: requests_per_client *
    level), each also bounded by `base.duration_s`."""
    rows = []
    for level in levels:
        config = dataclasses.replace(
            base,
            concurrency=level,
            arrival=None,
            max_concurrency=None,
            num_requests=num_requests or requests_per_client * level,
        )
        result = await run(config)
        row = SweepRow(level, summarize(result.records, config.slo, result.duration_s))
        rows.append(row)
        on_row(row)
    return rows


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


ROW_HEADER = (
    f"{'load':>9}{'req/s':>9}{'out tok/s':>11}{'TTFT p50':>10}{'TTFT p99':>10}"
    f"{'TPOT p50':>10}{'TPOT p99':>10}{'E2E p50':>10}{'errors':>8}{'SLO met':>9}"
)


def format_row(row: SweepRow) -> str:
    r = row.report
    met = attainment(r)
    verdict = "" if row.passed is None else ("  held" if row.passed else "  missed")
    return (
        f"{row.load:>9g}{r.request_rps:>9.2f}{r.output_tok_s:>11.1f}{_ms(r.ttft.p50):>10}"
        f"{_ms(r.ttft.p99):>10}{_ms(r.tpot.p50):>10}{_ms(r.tpot.p99):>10}{_ms(r.e2e.p50):>10}"
        f"{r.num_errors:>8}{'-' if met is None else f'{met:.1%}':>9}{verdict}"
    )


def sweep_dict(rows: Sequence[SweepRow], **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "rows": [
            {"load": r.load, "passed": r.passed, "summary": dataclasses.asdict(r.report)}
            for r in rows
        ],
    }
