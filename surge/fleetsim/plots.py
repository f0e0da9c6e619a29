"""PNG per policy: demand and the forecast against the ready capacity (top), replicas ready and
starting (bottom); and one of all the policies' replicas together. matplotlib's object API on
the Agg canvas, as surge/bench/plots.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from surge.fleetsim.result import smooth
from surge.fleetsim.simulate import SimResult


def _hours(t: list[float]) -> tuple[np.ndarray, str]:
    a = np.asarray(t)
    span = a[-1] - a[0] if len(a) > 1 else 0.0
    if span > 4 * 3600:
        return a / 3600, "hours"
    if span > 600:
        return a / 60, "minutes"
    return a, "seconds"


def save_plots(result: SimResult, out_dir: str | Path, title: str) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    per_replica = result.run.capacity_rps
    paths = []
    together = Figure(figsize=(11, 4))
    ax_all = together.add_subplot(1, 1, 1)
    for name, r in result.results.items():
        tl = r.timeline
        if len(tl.t) < 2:
            continue
        x, unit = _hours(tl.t)
        n = max(1, round(60 / (tl.t[1] - tl.t[0])))
        fig = Figure(figsize=(11, 6))
        top, bottom = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2, sharex=None)
        top.plot(x, smooth(np.asarray(tl.demand_rps), n), lw=1, label="demand (1 min mean)")
        top.plot(x, np.asarray(tl.ready) * per_replica, lw=1, label="ready capacity")
        if not np.all(np.isnan(tl.forecast_rps)):
            top.plot(x, tl.forecast_rps, lw=0.8, alpha=0.7, label="forecast")
        for p in r.summary(result.run)["peaks"]:
            top.axvline(_scale(p["t_s"], unit), color="grey", lw=0.5, ls=":")  # a peak
        top.set_ylabel("requests/s")
        top.legend(loc="upper left", fontsize=8)
        top.set_title(f"{name}: {title}")
        bottom.step(x, tl.ready, where="post", lw=1, label="ready")
        bottom.step(
            x,
            np.asarray(tl.ready) + np.asarray(tl.starting),
            where="post",
            lw=0.8,
            alpha=0.7,
            label="ready + starting",
        )
        bottom.set_ylabel("replicas")
        bottom.set_xlabel(unit)
        bottom.legend(loc="upper left", fontsize=8)
        ax_all.step(x, tl.ready, where="post", lw=0.8, label=name)
        paths.append(_save(fig, out / f"{name}.png"))
    ax_all.set_ylabel("ready replicas")
    ax_all.set_title(title)
    ax_all.legend(fontsize=8)
    paths.append(_save(together, out / "replicas.png"))
    return paths


def _scale(t_s: float, unit: str) -> float:
    return t_s / {"hours": 3600, "minutes": 60}.get(unit, 1)


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
