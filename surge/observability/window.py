"""Figures over the last N seconds from cumulative ones: counter rates and histogram quantiles
from snapshots taken once a tick (what Prometheus' rate() and histogram_quantile() compute)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

Buckets = tuple[tuple[float, float], ...]  # (upper bound `le`, cumulative count), +Inf last


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' estimate: find the bucket holding rank q * count, interpolate linearly
    inside it (from 0 for the first); None when empty. The +Inf bucket answers its lower bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank and count > below:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def bucket_delta(new: Buckets, old: Buckets | None) -> Buckets:
    """Per-bucket difference; a histogram that restarted (counts fell) counts from zero."""
    if old is None or len(old) != len(new):
        return new
    if any(n < o for (_, n), (_, o) in zip(new, old, strict=True)):
        return new
    return tuple((le, n - o) for (le, n), (_, o) in zip(new, old, strict=True))


@dataclass(slots=True)
class Snapshot:
    t_s: float
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Buckets] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)


class History:
    """Snapshots of the last `keep_s` seconds, oldest first."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._snaps: deque[Snapshot] = deque()

    def add(self, snap: Snapshot) -> None:
        self._snaps.append(snap)
        while self._snaps and self._snaps[0].t_s < snap.t_s - self.keep_s:
            self._snaps.popleft()

    def __len__(self) -> int:
        return len(self._snaps)

    @property
    def latest(self) -> Snapshot | None:
        return self._snaps[-1] if self._snaps else None

    def since(self, over_s: float) -> Snapshot | None:
        """The oldest snapshot within `over_s` of the latest."""
        if not self._snaps:
            return None
        cutoff = self._snaps[-1].t_s - over_s
        return next(s for s in self._snaps if s.t_s >= cutoff)

    def delta(self, name: str, over_s: float) -> tuple[float, float]:
        """(increase of counter `name`, seconds it covers) over the last `over_s`."""
        old, new = self.since(over_s), self.latest
        if old is None or new is None:
            return 0.0, 0.0
        a, b = old.counters.get(name, 0.0), new.counters.get(name, 0.0)
        return (b - a if b >= a else b), new.t_s - old.t_s

    def rate(self, name: str, over_s: float) -> float:
        inc, span = self.delta(name, over_s)
        return inc / span if span > 0 else 0.0

    def quantile(self, name: str, q: float, over_s: float) -> float | None:
        old, new = self.since(over_s), self.latest
        if new is None or name not in new.histograms:
            return None
        before = old.histograms.get(name) if old is not None and old is not new else None
        return histogram_quantile(q, bucket_delta(new.histograms[name], before))

    def series(self, key: str, kind: str = "gauges") -> list[float]:
        """One gauge (or counter) per snapshot, oldest first (0 where missing)."""
        return [getattr(s, kind).get(key, 0.0) for s in self._snaps]

    def times(self) -> list[float]:
        return [s.t_s for s in self._snaps]
