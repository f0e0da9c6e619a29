"""`surge bench compare A.json B.json`: two runs side by side, with B / A."""

from __future__ import annotations

from typing import Any

# (label, path in the summary, scale for display, unit)
ROWS: tuple[tuple[str, str, float, str], ...] = (
    ("requests ok", "num_ok", 1, ""),
    ("errors", "num_errors", 1, ""),
    ("duration", "duration_s", 1, "s"),
    ("throughput", "request_rps", 1, "req/s"),
    ("output tokens/s", "output_tok_s", 1, "tok/s"),
    ("total tokens/s", "total_tok_s", 1, "tok/s"),
    ("goodput", "goodput.rps", 1, "req/s"),
    ("SLO met", "goodput.fraction_met", 100, "%"),
    ("TTFT mean", "ttft.mean", 1000, "ms"),
    ("TTFT p50", "ttft.p50", 1000, "ms"),
    ("TTFT p90", "ttft.p90", 1000, "ms"),
    ("TTFT p99", "ttft.p99", 1000, "ms"),
    ("TPOT p50", "tpot.p50", 1000, "ms"),
    ("TPOT p99", "tpot.p99", 1000, "ms"),
    ("ITL p50", "itl.p50", 1000, "ms"),
    ("ITL p99", "itl.p99", 1000, "ms"),
    ("E2E p50", "e2e.p50", 1000, "ms"),
    ("E2E p99", "e2e.p99", 1000, "ms"),
)


def lookup(summary: dict[str, Any], path: str) -> float | None:
    value: Any = summary
    for key in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return float(value) if isinstance(value, int | float) else None


def _cell(v: float | None, scale: float) -> str:
    return "-" if v is None else f"{v * scale:.4g}"


def _name(result: dict[str, Any], fallback: str) -> str:
    label = result.get("label")
    return str(label) if label else fallback


def compare_table(
    a: dict[str, Any], b: dict[str, Any], a_name: str = "A", b_name: str = "B"
) -> str:
    """A table of A's and B's summaries (overall, then per tenant both share) with B / A."""
    names = (_name(a, a_name)[:14], _name(b, b_name)[:14])
    lines = [f"{'':<18}{names[0]:>14}{names[1]:>14}{'B / A':>9}"]
    lines += _rows(a["summary"], b["summary"])
    for split in ("by_tenant", "by_priority"):
        shared = sorted(set(a["summary"].get(split, {})) & set(b["summary"].get(split, {})))
        for key in shared:
            lines += ["", f"{split[3:]} {key}"]
            lines += _rows(a["summary"][split][key], b["summary"][split][key], brief=True)
    return "\n".join(lines)


def _rows(sa: dict[str, Any], sb: dict[str, Any], brief: bool = False) -> list[str]:
    lines = []
    for label, path, scale, unit in ROWS:
        if brief and path in ("duration_s", "total_tok_s", "ttft.mean"):
            continue
        va, vb = lookup(sa, path), lookup(sb, path)
        if va is None and vb is None:
            continue
        ratio = f"{vb / va:.2f}x" if va and vb is not None else "-"
        title = f"{label} ({unit})" if unit else label
        lines.append(f"{title:<18}{_cell(va, scale):>14}{_cell(vb, scale):>14}{ratio:>9}")
    return lines
