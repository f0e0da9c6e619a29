"""A replica's measured service, read from a `surge bench sweep --concurrency ... --output F`
result: per concurrency level (rows[].load), its TTFT and TPOT (the run's mean), the requests
per second it served, and the output tokens per request (the sweep's --output-len).

Between levels it interpolates linearly; past the highest it extrapolates the last segment's
slope (more sequences than were measured run slower, never faster). Plus the replica's cold
start (`start_s`, from benchmarks/bench_startup.py), kept in the same file under "replica".
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class CapacityProfile:
    levels: tuple[float, ...]  # concurrency
    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]
    rps: tuple[float, ...]
    output_tokens: float  # per request
    start_s: float = 10.0  # cold start: asked for -> ready
    source: str = ""
    prompt_tokens: float = 0.0  # per request
    replica: dict[str, float] | None = None  # what the measured replica had: cpus, rss_gib, ...

    def __post_init__(self) -> None:
        if not self.levels or list(self.levels) != sorted(set(self.levels)):
            raise ValueError("profile: concurrency levels must be given, increasing")
        n = len(self.levels)
        if not len(self.ttft_s) == len(self.tpot_s) == len(self.rps) == n:
            raise ValueError("profile: one TTFT, TPOT and rate per level")

    def _at(self, values: tuple[float, ...], c: float) -> float:
        lv = self.levels
        if c <= lv[0] or len(lv) == 1:
            return values[0]
        if c <= lv[-1]:  # scalar interpolation (np.interp costs 5 us a call: the sim's hot path)
            i = bisect.bisect_left(lv, c)
            frac = (c - lv[i - 1]) / (lv[i] - lv[i - 1])
            return values[i - 1] + frac * (values[i] - values[i - 1])
        slope = max(0.0, (values[-1] - values[-2]) / (lv[-1] - lv[-2]))
        return values[-1] + slope * (c - lv[-1])

    def ttft(self, c: float) -> float:
        return self._at(self.ttft_s, max(c, 1.0))

    def tpot(self, c: float) -> float:
        return self._at(self.tpot_s, max(c, 1.0))

    def e2e(self, c: float) -> float:
        return self.ttft(c) + max(0.0, self.output_tokens - 1) * self.tpot(c)

    def max_level_within(self, ttft_s: float | None, tpot_s: float | None) -> float:
        """The highest measured concurrency whose TTFT and TPOT meet the targets (the first
        level if none does)."""
        ok = [
            c
            for c, a, b in zip(self.levels, self.ttft_s, self.tpot_s, strict=True)
            if (ttft_s is None or a <= ttft_s) and (tpot_s is None or b <= tpot_s)
        ]
        return max(ok) if ok else self.levels[0]

    def rps_at(self, c: float) -> float:
        """Requests per second one replica finishes at concurrency c (Little: c / e2e)."""
        return c / self.e2e(c)


def _mean(stats: dict[str, Any]) -> float:
    v = stats.get("mean") if stats.get("mean") is not None else stats.get("p50")
    if v is None:
        raise ValueError("profile: a row has no latency (no request succeeded)")
    return float(v)


def load_profile(path: str | Path, start_s: float | None = None) -> CapacityProfile:
    data = json.loads(Path(path).read_text())
    rows = sorted(data.get("rows", []), key=lambda r: float(r["load"]))
    if not rows:
        raise ValueError(f"{path}: no rows (expected `surge bench sweep --concurrency` output)")
    summaries = [r["summary"] for r in rows]
    out_tokens = [s["num_output_tokens"] / max(1, s["num_ok"]) for s in summaries]
    in_tokens = [s.get("num_prompt_tokens", 0) / max(1, s["num_ok"]) for s in summaries]
    replica = data.get("replica", {})
    return CapacityProfile(
        levels=tuple(float(r["load"]) for r in rows),
        ttft_s=tuple(_mean(s["ttft"]) for s in summaries),
        tpot_s=tuple(_mean(s["tpot"]) for s in summaries),
        rps=tuple(float(s["request_rps"]) for s in summaries),
        output_tokens=float(np.mean(out_tokens)) if out_tokens else 1.0,
        start_s=float(start_s if start_s is not None else replica.get("start_s", 10.0)),
        source=str(path),
        prompt_tokens=float(np.mean(in_tokens)),
        replica={k: float(v) for k, v in replica.items() if isinstance(v, int | float)},
    )


def replicas_for(peak_rps: float, per_replica_rps: float, headroom: float = 0.0) -> int:
    return max(1, math.ceil(peak_rps * (1 + headroom) / per_replica_rps - 1e-9))
