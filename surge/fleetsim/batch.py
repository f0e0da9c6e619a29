"""Batch work in the simulated fleet (`surge autoscale simulate --batch ...`): jobs of the Batch
API (docs/batch.md) submitted at set times, each with a window (its SLO), whose lines run at the
lowest priority in what interactive traffic leaves of the replicas.

    --batch lines=5000,tokens=200,window=6h,at=14:00[,every=1d]

`lines`: requests in the job; `tokens`: output tokens per line (its prompt is the profile's);
`window`: the completion window; `at`: when it is submitted, from the simulated span's start
(`14:00` and `14h` alike); `every`: submitted again at that interval. Every job whose window
closes within the span is simulated and judged: finished within its window or not.

Both modes share the bookkeeping here: the lines pending (earliest deadline first, as a
scheduler of deadlines would take them), in flight, done; the batch signals the replicas'
/metrics would show (surge:batch_lines{state}, surge:batch_window_seconds_left,
surge:batch_lines_per_second over the last RATE_WINDOW_S); and each job's finish time. Lines are
floats: the fluid mode moves fractions of them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from surge.autoscale.signals import BatchSignals
from surge.bench.config import parse_duration

RATE_WINDOW_S = 60.0  # surge:batch_lines_per_second: completions over this long
UNITS = {"d": 86400.0, "h": 3600.0}


def parse_span(text: str) -> float:
    """Seconds from bench's durations (2s, 100ms, 5m, 1.5), hours, days (6h, 1d) or HH:MM."""
    t = text.strip()
    if ":" in t:
        hours, _, minutes = t.partition(":")
        try:
            return int(hours) * 3600.0 + int(minutes) * 60.0
        except ValueError:
            raise ValueError(f"bad time {text!r}: expected HH:MM") from None
    if t and t[-1] in UNITS:
        try:
            return float(t[:-1]) * UNITS[t[-1]]
        except ValueError:
            raise ValueError(f"bad duration {text!r}") from None
    return parse_duration(t)


@dataclass(frozen=True, slots=True)
class BatchSpec:
    lines: int
    tokens: float  # output tokens per line
    window_s: float
    at_s: float = 0.0
    every_s: float | None = None

    def __post_init__(self) -> None:
        if self.lines < 1 or not self.tokens >= 1:
            raise ValueError("batch: lines and tokens must be >= 1")
        if not self.window_s > 0 or self.at_s < 0:
            raise ValueError("batch: window must be > 0 and at >= 0")
        if self.every_s is not None and not self.every_s > 0:
            raise ValueError("batch: every must be > 0")

    @classmethod
    def parse(cls, text: str) -> BatchSpec:
        keys = {"lines", "tokens", "window", "at", "every"}
        values: dict[str, str] = {}
        for part in filter(None, text.split(",")):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in keys:
                raise ValueError(
                    f"batch: expected {','.join(sorted(keys))} as key=value, got {part!r}"
                )
            values[key.strip()] = value.strip()
        missing = {"lines", "window"} - set(values)
        if missing:
            raise ValueError(f"batch: {', '.join(sorted(missing))} missing in {text!r}")
        try:
            return cls(
                lines=int(values["lines"]),
                tokens=float(values.get("tokens", "64")),
                window_s=parse_span(values["window"]),
                at_s=parse_span(values.get("at", "0")),
                every_s=parse_span(values["every"]) if "every" in values else None,
            )
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith("batch") else f"batch: {e}") from None

    def jobs(self, duration_s: float) -> list[Job]:
        """Its submissions whose windows close within the span."""
        out = []
        t = self.at_s
        while t + self.window_s <= duration_s + 1e-9:
            out.append(Job(t, t + self.window_s, float(self.lines), self.tokens))
            if self.every_s is None:
                break
            t += self.every_s
        return out


@dataclass(slots=True)
class Job:
    submit_s: float
    deadline_s: float
    lines: float
    tokens: float
    pending: float = 0.0
    in_flight: float = 0.0
    done: float = 0.0
    finished_s: float | None = None

    @property
    def finished(self) -> bool:
        return self.finished_s is not None


class BatchQueue:
    """Every job's lines: submitted when due, taken earliest deadline first, done or handed back
    (preempted, or on a drained replica: they run again, from the start)."""

    def __init__(self, specs: tuple[BatchSpec, ...], duration_s: float) -> None:
        for spec in specs:
            if not spec.jobs(duration_s):
                raise ValueError(
                    f"batch: no window closes within --duration {duration_s:g} s "
                    f"(at {spec.at_s:g} s + window {spec.window_s:g} s)"
                )
        self.jobs = sorted((j for s in specs for j in s.jobs(duration_s)), key=lambda j: j.submit_s)
        self._due = 0  # jobs[:_due] are submitted
        self.active: list[Job] = []  # submitted, unfinished: by deadline
        self.pending = 0.0
        self.in_flight = 0.0
        self.done = 0.0
        self._done_at: deque[tuple[float, float]] = deque()  # (time, lines done by then)

    def submit_due(self, now_s: float) -> bool:
        """Submit the jobs due by now; True when any was."""
        start = self._due
        if not self.active:  # a busy period begins: the rate is of it alone
            self._done_at.clear()
        while self._due < len(self.jobs) and self.jobs[self._due].submit_s <= now_s:
            job = self.jobs[self._due]
            job.pending = job.lines
            self.pending += job.lines
            self.active.append(job)
            self._due += 1
        if self._due > start:
            self.active.sort(key=lambda j: j.deadline_s)
            return True
        return False

    def take(self, n: float) -> list[tuple[Job, float]]:
        """Up to n lines to start, earliest deadline first: [(job, lines)]."""
        out = []
        for job in self.active:
            if n <= 1e-12:
                break
            k = min(n, job.pending)
            if k > 1e-12:
                job.pending -= k
                job.in_flight += k
                n -= k
                out.append((job, k))
        taken = sum(k for _, k in out)
        self.pending -= taken
        self.in_flight += taken
        return out

    def give_back(self, job: Job, n: float) -> None:
        job.in_flight -= n
        job.pending += n
        self.in_flight -= n
        self.pending += n

    def finish(self, job: Job, n: float, now_s: float) -> None:
        job.in_flight -= n
        job.done += n
        self.in_flight -= n
        self.done += n
        if job.finished_s is None and job.done >= job.lines - 1e-6:
            job.finished_s = now_s
            job.pending = job.in_flight = 0.0
            self.active.remove(job)
            if not self.active:  # no fractions left over from float sums
                self.pending = self.in_flight = 0.0

    def signals(self, now_s: float) -> BatchSignals:
        """What the servers' /metrics would show now."""
        done_at = self._done_at
        done_at.append((now_s, self.done))
        while len(done_at) > 1 and done_at[1][0] <= now_s - RATE_WINDOW_S:
            done_at.popleft()
        t0, d0 = done_at[0]
        rate = (self.done - d0) / (now_s - t0) if now_s > t0 else 0.0
        left = [j.deadline_s - now_s for j in self.active if j.deadline_s > now_s]
        return BatchSignals(
            pending=max(0.0, self.pending),
            in_flight=max(0.0, self.in_flight),
            window_left_s=min(left, default=0.0),
            lines_per_s=rate,
        )

    def summary(self) -> dict[str, Any] | None:
        if not self.jobs:
            return None
        met = [j for j in self.jobs if j.finished_s is not None and j.finished_s <= j.deadline_s]
        took = [j.finished_s - j.submit_s for j in self.jobs if j.finished_s is not None]
        return {
            "batches": len(self.jobs),
            "window_attainment": len(met) / len(self.jobs),
            "lines": sum(j.lines for j in self.jobs),
            "lines_done": round(sum(min(j.done, j.lines) for j in self.jobs), 3),
            "hours_to_finish": [
                None if j.finished_s is None else round((j.finished_s - j.submit_s) / 3600, 3)
                for j in self.jobs
            ],
            "mean_hours_to_finish": sum(took) / len(took) / 3600 if took else None,
        }


def line_seconds(profile_ttft: float, profile_tpot: float, tokens: float) -> float:
    """A line's time in an engine at a concurrency: its first token, then one TPOT a token."""
    return profile_ttft + max(0.0, tokens - 1) * profile_tpot
