"""The terminal table and the JSON result file (config + summary + raw records)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from surge.bench.client import RequestRecord
from surge.bench.config import BenchConfig, Slo
from surge.bench.drive import RunResult
from surge.bench.metrics import Report, Stats

FORMAT_VERSION = 1


def describe_load(config: BenchConfig) -> str:
    if config.concurrency is not None:
        return f"closed loop, concurrency {config.concurrency}"
    a = config.arrival
    assert a is not None
    detail = {
        "constant": f"{a.rate_rps:g} req/s",
        "poisson": f"{a.rate_rps:g} req/s",
        "gamma": f"{a.rate_rps:g} req/s, cv {a.cv:g}",
        "sinusoid": f"base {a.base_rps:g}, peak {a.peak_rps:g} req/s, period {a.period_s:g} s",
        "pulse": f"{a.burst_size} every {a.period_s:g} s, base {a.base_rps:g} req/s",
        "step": ", ".join(f"{r:g} req/s from {s:g} s" for s, r in a.steps),
        "trace": f"speedup {a.trace_speedup:g}",
    }[a.kind]
    cap = f", at most {config.max_concurrency} in flight" if config.max_concurrency else ""
    return f"open loop, {a.kind} ({detail}){cap}"


def describe_slo(slo: Slo) -> str:
    parts = [
        f"{name}<={_ms(v)}"
        for name, v in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s))
        if v is not None
    ]
    return ", ".join(parts)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f}ms" if seconds < 1 else f"{seconds:.2f}s"


def _row(name: str, s: Stats) -> str:
    vals = [s.mean, s.p50, s.p90, s.p95, s.p99, s.max]
    cells = "".join(f"{'-' if v is None else f'{v * 1000:.1f}':>10}" for v in vals)
    return f"{name:<10}{cells}{s.count:>9}"


def format_table(report: Report, title: str = "", slo: Slo | None = None) -> str:
    lines = [title] if title else []
    r = report
    lines += [
        f"requests  {r.num_ok} ok, {r.num_errors} errors, {r.num_cancelled} cancelled"
        f" of {r.num_requests} in {r.duration_s:.2f} s",
        f"throughput {r.request_rps:.2f} req/s, {r.output_tok_s:.1f} output tok/s,"
        f" {r.total_tok_s:.1f} total tok/s",
    ]
    if r.num_cached_tokens is not None and r.num_prompt_tokens:
        share = r.num_cached_tokens / r.num_prompt_tokens
        lines.append(
            f"prefix cache {r.num_cached_tokens} of {r.num_prompt_tokens} prompt tokens"
            f" cached ({share:.1%})"
        )
    if r.goodput is not None:
        g = r.goodput
        met = "-" if g.fraction_met is None else f"{g.fraction_met:.1%}"
        lines.append(
            f"goodput   {g.rps:.2f} req/s, {g.output_tok_s:.1f} output tok/s;"
            f" {met} of {g.num_judged} met the SLO" + (f" ({describe_slo(slo)})" if slo else "")
        )
    head = "".join(f"{h:>10}" for h in ("mean", "p50", "p90", "p95", "p99", "max"))
    lines += [f"{'ms':<10}{head}{'count':>9}"]
    lines += [
        _row(n, s) for n, s in (("TTFT", r.ttft), ("TPOT", r.tpot), ("ITL", r.itl), ("E2E", r.e2e))
    ]
    if r.lateness.count:
        lines.append(_row("lateness", r.lateness))
    if r.errors:
        lines.append("errors    " + ", ".join(f"{k}: {v}" for k, v in r.errors.items()))
    for label, splits in (("tenant", r.by_tenant), ("priority", r.by_priority)):
        if splits:
            lines += ["", _split_table(label, splits)]
    return "\n".join(lines)


def _split_table(label: str, splits: dict[str, Report]) -> str:
    cols = (
        "reqs",
        "ok",
        "err",
        "req/s",
        "out tok/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "SLO met",
    )
    lines = [f"{label:<10}" + "".join(f"{c:>10}" for c in cols)]
    for name, s in splits.items():
        met = s.goodput.fraction_met if s.goodput else None
        cells = [
            str(s.num_requests),
            str(s.num_ok),
            str(s.num_errors),
            f"{s.request_rps:.2f}",
            f"{s.output_tok_s:.1f}",
            _ms(s.ttft.p50),
            _ms(s.ttft.p99),
            _ms(s.tpot.p50),
            _ms(s.tpot.p99),
            "-" if met is None else f"{met:.1%}",
        ]
        lines.append(f"{name:<10}" + "".join(f"{c:>10}" for c in cells))
    return "\n".join(lines)


def config_dict(config: BenchConfig) -> dict[str, Any]:
    d = dataclasses.asdict(config)
    if d.get("api_key"):
        d["api_key"] = "***"  # a result file gets shared; the key must not travel with it
    d["extra_body"] = dict(config.extra_body)
    return d


def result_dict(run: RunResult, report: Report) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "label": run.config.label,
        "started_at": run.started_at,
        "config": config_dict(run.config),
        "summary": dataclasses.asdict(report),
        "records": [dataclasses.asdict(r) for r in run.records],
    }


def save_result(path: str | Path, result: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def load_result(path: str | Path) -> dict[str, Any]:
    result = json.loads(Path(path).read_text())
    if not isinstance(result, dict) or "summary" not in result:
        raise ValueError(f"{path}: not a surge bench result (no summary)")
    return result


def records_from(result: dict[str, Any]) -> list[RequestRecord]:
    names = set(RequestRecord.__dataclass_fields__)
    return [RequestRecord(**{k: v for k, v in r.items() if k in names}) for r in result["records"]]
