"""How many batch lines may be in flight now: all the room when interactive work is not waiting,
less while it is (AIMD, time passed in).

Priority preemption (the engine's priority policies) takes a batch line's slot and blocks when
an interactive request needs them, but a batch line that keeps its slot still makes every step
longer (more rows), and its prefill chunks share the step's token budget. So while interactive
requests wait for a first token the runner halves its lines in flight (at most once per
`cooldown_s`), and grows them back by one per tick once none wait: a valley fills up, a peak
pushes the batch back within a few steps."""

from __future__ import annotations


class Throttle:
    def __init__(self, low: int, high: int, cooldown_s: float = 0.5) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"need 1 <= low <= high, got {low}, {high}")
        self.low, self.high = low, high
        self.cooldown_s = cooldown_s
        self.limit = high
        self._cut_at_s = float("-inf")

    def update(self, interactive_waiting: int, now_s: float, high: int | None = None) -> int:
        """The limit now, given the interactive requests waiting for a first token; `high`
        moves the ceiling (a gateway's grows with its upstreams)."""
        if high is not None:
            self.high = max(self.low, high)
        if interactive_waiting > 0:
            if now_s - self._cut_at_s >= self.cooldown_s:
                self.limit = max(self.low, self.limit // 2)
                self._cut_at_s = now_s
        else:
            self.limit = min(self.high, self.limit + 1)
        self.limit = min(self.limit, self.high)
        return self.limit
