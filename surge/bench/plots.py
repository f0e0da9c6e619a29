"""PNG plots of a run (matplotlib's object API on the Agg canvas: no pyplot, no global backend).

load.png                offered vs achieved load over time, output tokens/s and requests in flight
latency_over_time.png   TTFT and TPOT percentiles per window (by send time)
cdf.png                 CDFs of TTFT, TPOT and e2e latency
tenants.png             per tenant: output tokens/s and TTFT p90 over time (only with tenants)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from surge.bench.arrivals import rate_at
from surge.bench.client import RequestRecord
from surge.bench.config import ArrivalConfig


def save_plots(
    records: Sequence[RequestRecord],
    out_dir: str | Path,
    *,
    duration_s: float,
    arrival: ArrivalConfig | None = None,
    window_s: float | None = None,
    title: str = "",
) -> list[Path]:
    """Write the plots into `out_dir` (created); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    end_s = max([duration_s, *(r.done_s for r in records if r.done_s is not None)])
    window = window_s or _default_window(end_s)
    edges = np.arange(0.0, end_s + window, window)
    paths = [
        _save(_load_figure(records, edges, arrival, title), out / "load.png"),
        _save(_latency_figure(records, edges, title), out / "latency_over_time.png"),
        _save(_cdf_figure(records, title), out / "cdf.png"),
    ]
    if any(r.tenant is not None for r in records):
        paths.append(_save(_tenant_figure(records, edges, title), out / "tenants.png"))
    return paths


def _default_window(end_s: float) -> float:
    """About 40 windows, at a round-ish width."""
    raw = max(end_s / 40, 0.05)
    for nice in (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600):
        if raw <= nice:
            return float(nice)
    return raw


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


def _figure(rows: int, cols: int, title: str, height: float = 3.2) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(6 * cols, height * rows), layout="constrained")
    axes = list(np.asarray(fig.subplots(rows, cols, squeeze=False)).ravel())
    if title:
        fig.suptitle(title)
    return fig, axes


def _per_s(
    times: Sequence[float], edges: np.ndarray, weights: Sequence[float] | None = None
) -> np.ndarray:
    counts, _ = np.histogram(np.asarray(times, dtype=float), bins=edges, weights=weights)
    return np.asarray(counts / np.diff(edges))


def _token_times(records: Sequence[RequestRecord]) -> tuple[list[float], list[float]]:
    """(chunk time, tokens in it) for successful requests; a chunk of unknown size gets an even
    share of the request's output tokens."""
    times, tokens = [], []
    for r in records:
        if not r.ok or not r.chunk_s:
            continue
        sizes: Sequence[float] = r.chunk_tokens or [r.output_tokens / len(r.chunk_s)] * len(
            r.chunk_s
        )
        times += r.chunk_s
        tokens += [float(s) for s in sizes]
    return times, tokens


def _load_figure(
    records: Sequence[RequestRecord],
    edges: np.ndarray,
    arrival: ArrivalConfig | None,
    title: str,
) -> Figure:
    fig, (ax, ax_tok) = _figure(2, 1, title)
    mid = (edges[:-1] + edges[1:]) / 2
    scheduled = [r.scheduled_s for r in records if r.scheduled_s is not None]
    if scheduled:
        ax.step(mid, _per_s(scheduled, edges), where="mid", label="offered (scheduled)")
    sent = [r.send_s for r in records if r.send_s is not None]
    ax.step(mid, _per_s(sent, edges), where="mid", label="sent")
    done = [r.done_s for r in records if r.ok and r.done_s is not None]
    ax.step(mid, _per_s(done, edges), where="mid", label="completed")
    if arrival is not None and rate_at(arrival, 0.0) is not None:
        fine = np.linspace(edges[0], edges[-1], 400)
        model = [rate_at(arrival, float(t)) or 0.0 for t in fine]
        ax.plot(fine, model, "k--", lw=1, label="model")
    ax.set_ylabel("requests/s")
    ax.legend(fontsize="small")
    times, tokens = _token_times(records)
    ax_tok.step(mid, _per_s(times, edges, tokens), where="mid", color="C3", label="output tok/s")
    ax_tok.set_ylabel("output tokens/s")
    ax_tok.set_xlabel("time (s)")
    in_flight = ax_tok.twinx()
    spans = [(r.send_s, r.done_s) for r in records if r.send_s is not None and r.done_s is not None]
    in_flight.plot(mid, [sum(a <= t < b for a, b in spans) for t in mid], color="C4", lw=1)
    in_flight.set_ylabel("in flight", color="C4")
    return fig


def _percentiles_by_window(
    times: Sequence[float], values: Sequence[float], edges: np.ndarray
) -> dict[int, list[float]]:
    t, v = np.asarray(times), np.asarray(values)
    out: dict[int, list[float]] = {50: [], 90: [], 99: []}
    for lo, hi in itertools.pairwise(edges):
        sample = v[(t >= lo) & (t < hi)]
        for q in out:
            out[q].append(float(np.percentile(sample, q)) if len(sample) else float("nan"))
    return out


def _latency_figure(records: Sequence[RequestRecord], edges: np.ndarray, title: str) -> Figure:
    fig, axes = _figure(2, 1, title)
    mid = (edges[:-1] + edges[1:]) / 2
    ok = [r for r in records if r.ok and r.send_s is not None]
    for ax, name in zip(axes, ("ttft_s", "tpot_s"), strict=True):
        pairs = [(r.send_s or 0.0, v) for r in ok if (v := getattr(r, name)) is not None]
        per = _percentiles_by_window([p[0] for p in pairs], [p[1] * 1000 for p in pairs], edges)
        for q, values in per.items():
            ax.plot(mid, values, marker=".", label=f"p{q}")
        ax.set_ylabel(f"{name[:-2].upper()} (ms)")
        ax.legend(fontsize="small")
    axes[-1].set_xlabel("send time (s)")
    return fig


def _cdf_figure(records: Sequence[RequestRecord], title: str) -> Figure:
    fig, axes = _figure(1, 3, title, height=3.6)
    ok = [r for r in records if r.ok]
    for ax, name in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), strict=True):
        values = np.sort([v * 1000 for r in ok if (v := getattr(r, name)) is not None])
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post")
        ax.set_xlabel(f"{name[:-2].upper()} (ms)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    return fig


def _tenant_figure(records: Sequence[RequestRecord], edges: np.ndarray, title: str) -> Figure:
    fig, (ax_tok, ax_ttft) = _figure(2, 1, title)
    mid = (edges[:-1] + edges[1:]) / 2
    tenants = sorted({r.tenant for r in records if r.tenant is not None})
    for tenant in tenants:
        mine = [r for r in records if r.tenant == tenant]
        times, tokens = _token_times(mine)
        ax_tok.step(mid, _per_s(times, edges, tokens), where="mid", label=tenant)
        ok = [r for r in mine if r.ok and r.send_s is not None and r.ttft_s is not None]
        per = _percentiles_by_window(
            [r.send_s for r in ok if r.send_s is not None],
            [r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
            edges,
        )
        ax_ttft.plot(mid, per[90], marker=".", label=tenant)
    ax_tok.set_ylabel("output tokens/s")
    ax_tok.legend(fontsize="small", title="tenant")
    ax_ttft.set_ylabel("TTFT p90 (ms)")
    ax_ttft.set_xlabel("time (s)")
    return fig
