"""The Batch API's Prometheus metrics, read at scrape time from the runner's own figures.

Names (an autoscaler reads them: keep them):
    surge:batch_lines{state}            lines of unfinished batches: pending, in_flight,
                                        completed, failed
    surge:batch_tokens_total            generation tokens of batch lines answered
    surge:batch_window_seconds_left     the least time left to any running batch's completion
                                        window (absent when no batch runs)
    surge:batch_lines_per_second        lines finished per second over the last minute
    surge:batch_concurrency_limit       lines the runner may have in flight now (throttle)
    surge:batches{status}               batches not yet ended, by status
    surge:batch_storage_ok              0 while the data folder cannot be written
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

RATE_WINDOW_S = 60.0
LINE_STATES = ("pending", "in_flight", "completed", "failed")


@dataclass
class BatchFigures:
    """What the runner knows; it updates these, a scrape reads them."""

    lines: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LINE_STATES, 0))
    batches: dict[str, int] = field(default_factory=dict)
    tokens: int = 0  # generation tokens of answered lines, since start
    prompt_tokens: int = 0
    window_left_s: float | None = None  # the soonest window end among running batches
    concurrency_limit: int = 0
    storage_ok: bool = True
    finished: deque[float] = field(default_factory=deque)  # monotonic times lines finished

    def line_finished(self, now_s: float) -> None:
        self.finished.append(now_s)
        self._trim(now_s)

    def lines_per_second(self, now_s: float) -> float:
        self._trim(now_s)
        return len(self.finished) / RATE_WINDOW_S

    def _trim(self, now_s: float) -> None:
        while self.finished and self.finished[0] < now_s - RATE_WINDOW_S:
            self.finished.popleft()


class BatchCollector(Collector):
    def __init__(self, figures: BatchFigures) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        f = self.figures
        lines = GaugeMetricFamily(
            "surge:batch_lines", "Lines of unfinished batches, by state.", labels=["state"]
        )
        for state in LINE_STATES:
            lines.add_metric([state], f.lines.get(state, 0))
        yield lines
        yield CounterMetricFamily(
            "surge:batch_tokens", "Generation tokens of batch lines.", value=f.tokens
        )
        yield CounterMetricFamily(
            "surge:batch_prompt_tokens", "Prompt tokens of batch lines.", value=f.prompt_tokens
        )
        left = GaugeMetricFamily(
            "surge:batch_window_seconds_left",
            "Seconds until the soonest completion window of a running batch ends.",
        )
        if f.window_left_s is not None:
            left.add_metric([], max(0.0, f.window_left_s))
            yield left
        yield GaugeMetricFamily(
            "surge:batch_lines_per_second",
            "Batch lines finished per second (last minute).",
            value=f.lines_per_second(time.monotonic()),
        )
        yield GaugeMetricFamily(
            "surge:batch_concurrency_limit",
            "Batch lines the runner may have in flight now.",
            value=f.concurrency_limit,
        )
        batches = GaugeMetricFamily(
            "surge:batches", "Batches not yet ended, by status.", labels=["status"]
        )
        for status in ("validating", "in_progress", "finalizing", "cancelling"):
            batches.add_metric([status], f.batches.get(status, 0))
        yield batches
        yield GaugeMetricFamily(
            "surge:batch_storage_ok",
            "1 while the batch data folder can be written, else 0.",
            value=1.0 if f.storage_ok else 0.0,
        )


def register(figures: BatchFigures, registry: CollectorRegistry) -> BatchCollector:
    collector = BatchCollector(figures)
    registry.register(collector)
    return collector
