"""The engine's recent throughput, in tokens per second of busy time, read from its step stream.

Each engine message carries cumulative token counters and whether work was left; the time
between two messages counts only when the first showed work (the engine then stepped without
waiting), so idle time never dilutes the rate, and the last busy rate is kept while idle.
"""

from __future__ import annotations

from collections import deque


class ThroughputMeter:
    """Tokens (prompt + generated) per busy second over the last `window_s` of busy time."""

    def __init__(self, window_s: float = 5.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._spans: deque[tuple[float, int]] = deque()  # (busy seconds, tokens) per step
        self._busy_s = 0.0
        self._tokens = 0
        self._last: tuple[float, int, bool] | None = None  # (now_s, cumulative tokens, busy)

    def observe(self, now_s: float, cumulative_tokens: int, busy: bool) -> None:
        last, self._last = self._last, (now_s, cumulative_tokens, busy)
        if last is None or not last[2]:
            return
        dt, tokens = now_s - last[0], cumulative_tokens - last[1]
        if dt <= 0 or tokens < 0:  # a restarted engine's counters start again from zero
            return
        self._spans.append((dt, tokens))
        self._busy_s += dt
        self._tokens += tokens
        while len(self._spans) > 1 and self._busy_s - self._spans[0][0] >= self.window_s:
            old_dt, old_tokens = self._spans.popleft()
            self._busy_s -= old_dt
            self._tokens -= old_tokens

    @property
    def tokens_per_s(self) -> float | None:
        """None until the engine has been busy long enough to measure (a few steps)."""
        if self._busy_s < 0.05 or self._tokens <= 0:
            return None
        return self._tokens / self._busy_s
