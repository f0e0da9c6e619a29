"""The observed arrival rate averaged into clock bins of `step_s` (bin k covers [k step,
(k+1) step)): what the seasonal and the learned forecasters model. A bin that no observation
fell in (a scrape gap) repeats the previous bin's mean."""

from __future__ import annotations

from collections.abc import Callable


class RateBins:
    def __init__(self, step_s: float, max_history_bins: int) -> None:
        self.step_s = step_s
        self.max_history_bins = max_history_bins
        self.history: list[float] = []  # the newest closed bins' means, oldest first
        self.first_bin = 0  # clock bin of the first one ever closed
        self.closed = 0  # bins closed so far
        self._bin: int | None = None  # clock bin being filled
        self._sum = 0.0
        self._count = 0

    def add(self, now_s: float, value: float, on_close: Callable[[float, int], None]) -> None:
        """Count `value` at `now_s`; for each bin this closes, once it is in the history,
        `on_close(mean, its clock bin)`."""
        b = int(now_s // self.step_s)
        if self._bin is None:
            self._bin = self.first_bin = b
        if b > self._bin:
            mean = self._sum / self._count if self._count else (self.history or [value])[-1]
            for _ in range(b - self._bin):
                self.history.append(mean)
                if len(self.history) > self.max_history_bins:
                    del self.history[: len(self.history) - self.max_history_bins]
                self.closed += 1
                on_close(mean, self.last_bin)
            self._bin, self._sum, self._count = b, 0.0, 0
        if b == self._bin:
            self._sum += value
            self._count += 1

    @property
    def last_bin(self) -> int:
        """Clock bin of the newest closed one."""
        return self.first_bin + self.closed - 1

    @property
    def open_mean(self) -> float | None:
        """The mean of the bin being filled; None before any observation."""
        return self._sum / self._count if self._count else None
