"""From records to numbers: `summarize(records, slo) -> Report`, a pure function.

Definitions (docs/bench.md has the long form):

- TTFT: first text chunk - send. E2E: end of the stream - send.
- TPOT: (e2e - ttft) / (output_tokens - 1), per request with at least 2 output tokens.
- ITL: every gap between consecutive text chunks, pooled over requests.
- Throughput: successful requests, their output tokens and their prompt + output tokens, per
  second of the run's duration.
- Goodput: the requests that met every target of the SLO, per second, and their output tokens per
  second; `fraction_met` is their share of the requests judged. A request that failed counts as a
  miss. One cancelled at the end of the run is judged only if it had already broken the TTFT or
  e2e target when it was cut off; otherwise its outcome is unknown and it is left out.
- Latency statistics use successful requests only; errors are counted by `error_type`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from surge.bench.client import RequestRecord
from surge.bench.config import Slo

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True, slots=True)
class Stats:
    """Summary of a sample in seconds; all None when it is empty. Percentiles interpolate
    linearly between order statistics (numpy's default)."""

    count: int = 0
    mean: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        if not values:
            return cls()
        a = np.asarray(values, dtype=float)
        p50, p90, p95, p99 = (float(x) for x in np.percentile(a, PERCENTILES))
        return cls(len(a), float(a.mean()), p50, p90, p95, p99, float(a.max()))


@dataclass(frozen=True, slots=True)
class Goodput:
    num_met: int
    num_judged: int
    fraction_met: float | None
    rps: float
    output_tok_s: float


@dataclass(frozen=True, slots=True)
class Report:
    num_requests: int
    num_ok: int
    num_errors: int
    num_cancelled: int
    errors: dict[str, int]
    duration_s: float
    request_rps: float
    output_tok_s: float
    total_tok_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int | None
    ttft: Stats
    tpot: Stats
    itl: Stats
    e2e: Stats
    lateness: Stats
    goodput: Goodput | None
    by_tenant: dict[str, Report] = field(default_factory=dict)
    by_priority: dict[str, Report] = field(default_factory=dict)


def meets_slo(record: RequestRecord, slo: Slo) -> bool | None:
    """True if `record` met every target, False if it missed one, None if it cannot be told."""
    ttft, e2e = record.ttft_s, record.e2e_s
    if record.cancelled:
        if e2e is None:
            return None
        late_first = slo.ttft_s is not None and (ttft if ttft is not None else e2e) > slo.ttft_s
        late_end = slo.e2e_s is not None and e2e > slo.e2e_s
        return False if late_first or late_end else None
    if not record.ok or ttft is None or e2e is None:
        return False
    tpot = record.tpot_s
    return (
        (slo.ttft_s is None or ttft <= slo.ttft_s)
        and (slo.tpot_s is None or tpot is None or tpot <= slo.tpot_s)
        and (slo.e2e_s is None or e2e <= slo.e2e_s)
    )


def span_s(records: Sequence[RequestRecord]) -> float:
    """First send to last answer: the duration when the run's own is not given."""
    starts = [r.send_s for r in records if r.send_s is not None]
    ends = [r.done_s for r in records if r.done_s is not None]
    return max(ends) - min(starts) if starts and ends else 0.0


def summarize(
    records: Sequence[RequestRecord], slo: Slo | None = None, duration_s: float | None = None
) -> Report:
    """The report of a run, overall and split by tenant and by priority where records have them.
    Rates divide by `duration_s` (default: first send to last answer), the same for every split,
    so the tenants' throughputs add up to the total."""
    duration = span_s(records) if duration_s is None else duration_s
    report = _summary(records, slo or Slo(), duration)
    tenants = _split(records, lambda r: r.tenant)
    priorities = _split(records, lambda r: r.priority)
    return _with_splits(
        report,
        {str(k): _summary(v, slo or Slo(), duration) for k, v in tenants.items()},
        {str(k): _summary(v, slo or Slo(), duration) for k, v in priorities.items()},
    )


def _split(
    records: Sequence[RequestRecord], key: Callable[[RequestRecord], Hashable]
) -> dict[Hashable, list[RequestRecord]]:
    groups: dict[Hashable, list[RequestRecord]] = {}
    for r in records:
        k = key(r)
        if k is not None:
            groups.setdefault(k, []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: str(kv[0])))


def _with_splits(report: Report, tenants: dict[str, Report], prios: dict[str, Report]) -> Report:
    fields = {name: getattr(report, name) for name in Report.__dataclass_fields__}
    return Report(**fields | {"by_tenant": tenants, "by_priority": prios})


def _rate(count: float, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else 0.0


def _summary(records: Sequence[RequestRecord], slo: Slo, duration_s: float) -> Report:
    ok = [r for r in records if r.ok]
    cancelled = [r for r in records if r.cancelled]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok and not r.cancelled:
            kind = r.error_type or f"http_{r.status}"
            errors[kind] = errors.get(kind, 0) + 1
    num_output = sum(r.output_tokens for r in ok)
    num_prompt = sum(r.num_prompt_tokens or r.input_len or 0 for r in ok)
    cached = [r.num_cached_tokens for r in ok if r.num_cached_tokens is not None]
    goodput = None
    if slo.is_set:
        verdicts = [(r, meets_slo(r, slo)) for r in records]
        met = [r for r, v in verdicts if v]
        judged = sum(v is not None for _, v in verdicts)
        goodput = Goodput(
            num_met=len(met),
            num_judged=judged,
            fraction_met=len(met) / judged if judged else None,
            rps=_rate(len(met), duration_s),
            output_tok_s=_rate(sum(r.output_tokens for r in met), duration_s),
        )
    return Report(
        num_requests=len(records),
        num_ok=len(ok),
        num_errors=sum(errors.values()),
        num_cancelled=len(cancelled),
        errors=dict(sorted(errors.items())),
        duration_s=duration_s,
        request_rps=_rate(len(ok), duration_s),
        output_tok_s=_rate(num_output, duration_s),
        total_tok_s=_rate(num_output + num_prompt, duration_s),
        num_prompt_tokens=num_prompt,
        num_output_tokens=num_output,
        num_cached_tokens=sum(cached) if cached else None,
        ttft=Stats.of([x for r in ok if (x := r.ttft_s) is not None]),
        tpot=Stats.of([x for r in ok if (x := r.tpot_s) is not None]),
        itl=Stats.of([x for r in ok for x in r.itl_s]),
        e2e=Stats.of([x for r in ok if (x := r.e2e_s) is not None]),
        lateness=Stats.of([x for r in records if (x := r.lateness_s) is not None]),
        goodput=goodput,
    )
