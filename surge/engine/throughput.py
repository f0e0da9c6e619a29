"""The engine's recent pace, read from its step stream: busy seconds per step, tokens per second.

Each engine message carries cumulative counters (tokens, steps) and whether work was left; the
time between two messages counts only when the first showed work (the engine then stepped
without waiting), so idle time never dilutes the figures, and the last busy ones are kept while
idle.
"""

from __future__ import annotations

from collections import deque


class ThroughputMeter:
    """Over the last `window_s` of busy time: tokens (prompt + generated) per busy second, and
    busy seconds per engine step."""

    def __init__(self, window_s: float = 5.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._spans: deque[tuple[float, int, int]] = deque()  # (busy s, tokens, steps)
        self._busy_s = 0.0
        self._tokens = 0
        self._steps = 0
        self._last: tuple[float, int, int, bool] | None = None  # now_s, tokens, steps, busy

    def observe(
        self, now_s: float, cumulative_tokens: int, cumulative_steps: int, busy: bool
    ) -> None:
        last, self._last = self._last, (now_s, cumulative_tokens, cumulative_steps, busy)
        if last is None or not last[3]:
            return
        dt, tokens, steps = now_s - last[0], cumulative_tokens - last[1], cumulative_steps - last[2]
        if dt <= 0 or tokens < 0 or steps <= 0:  # a restarted engine's counters start from zero
            return
        self._spans.append((dt, tokens, steps))
        self._busy_s += dt
        self._tokens += tokens
        self._steps += steps
        while len(self._spans) > 1 and self._busy_s - self._spans[0][0] >= self.window_s:
            old_dt, old_tokens, old_steps = self._spans.popleft()
            self._busy_s -= old_dt
            self._tokens -= old_tokens
            self._steps -= old_steps

    @property
    def tokens_per_s(self) -> float | None:
        """None until the engine has been busy for a few steps."""
        if self._steps < 3 or self._tokens <= 0:
            return None
        return self._tokens / self._busy_s

    @property
    def step_s(self) -> float | None:
        """Mean busy seconds per step; None until the engine has stepped a few times."""
        if self._steps < 3:
            return None
        return self._busy_s / self._steps
