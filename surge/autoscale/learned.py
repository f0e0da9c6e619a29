"""A small learned forecaster: a GRU trained online on the arrival history, as the source's
"LSTM over Prometheus data" suggests, kept CPU-cheap (hidden size 16, a few Adam steps every
`train_every` bins, one thread, predictions cached per bin).

Inputs per bin: the rate (scaled by the history's mean) and the phase of the season (sin and cos
of 2 pi t / period; the period is given or detected as the seasonal forecaster does), so a short
window (32 bins) is enough to place the daily cycle. It predicts the next bin and is rolled
forward to the horizon. Until it has trained it answers the last bin's mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from surge.autoscale.rate_bins import RateBins
from surge.autoscale.seasonal import detect_period


@dataclass(frozen=True, slots=True)
class LearnedConfig:
    step_s: float = 60.0
    period_s: float | None = None  # None: detected from the history
    window: int = 32  # bins the GRU reads
    hidden: int = 16
    train_every: int = 16  # bins between training rounds
    train_steps: int = 8  # Adam steps per round
    batch: int = 32
    lr: float = 0.01
    max_history_bins: int = 20_000
    seed: int = 0


class LearnedForecaster:
    def __init__(self, config: LearnedConfig | None = None) -> None:
        import torch  # optional: only this forecaster needs it

        self.config = c = config or LearnedConfig()
        self._torch = torch
        torch.set_num_threads(1)  # tiny model: one thread is faster than contending for all
        gen = torch.Generator().manual_seed(c.seed)
        torch.manual_seed(c.seed)
        self.gru = torch.nn.GRU(3, c.hidden, batch_first=True)
        self.head = torch.nn.Linear(c.hidden, 1)
        params = [*self.gru.parameters(), *self.head.parameters()]
        self.opt = torch.optim.Adam(params, lr=c.lr)
        self._gen = gen
        self._rng = np.random.default_rng(c.seed)
        self.period_bins: int | None = None if c.period_s is None else round(c.period_s / c.step_s)
        self.bins = RateBins(c.step_s, c.max_history_bins)
        self.trained = False
        self._seeding = False  # seed() under way: training waits for the whole history
        self._cache: dict[int, float] = {}  # target bin -> prediction, for the current history

    @property
    def history(self) -> list[float]:
        return self.bins.history

    def update(self, now_s: float, value: float) -> None:
        self.bins.add(now_s, value, self._close)

    def seed(self, points: Sequence[tuple[float, float]], max_rounds: int = 32) -> None:
        """Past (time, rate) observations in bulk (the history from Prometheus, history.py): the
        same bins as update(), but the training rounds they would have made, one every
        `train_every` bins (a day of minute bins: minutes of CPU), are capped at `max_rounds`,
        run at the end over the whole history."""
        closed = self.bins.closed
        self._seeding = True
        try:
            for at_s, value in points:
                self.update(at_s, value)
        finally:
            self._seeding = False
        rounds = min(max_rounds, (self.bins.closed - closed) // self.config.train_every)
        if len(self.history) > self.config.window + 1:
            for _ in range(rounds):
                self._train()
        self._cache.clear()

    def _close(self, x: float, clock_bin: int) -> None:
        """A bin closed (it is in the history): look for the season now and then, and train."""
        c = self.config
        self._cache.clear()
        if self.period_bins is None and self.bins.closed % 64 == 0:
            self.period_bins = detect_period(np.asarray(self.history))
        if self._seeding:
            return  # seed() trains once the history is in
        if self.bins.closed % c.train_every == 0 and len(self.history) > c.window + 1:
            self._train()

    def _features(self, values: np.ndarray, first_clock_bin: int) -> np.ndarray:
        scale = max(float(np.mean(self.history)), 1e-6)
        t = np.arange(first_clock_bin, first_clock_bin + len(values), dtype=float)
        m = self.period_bins or 1_000_000
        phase = 2 * math.pi * t / m
        return np.stack([values / scale, np.sin(phase), np.cos(phase)], axis=1)

    def _train(self) -> None:
        torch, c = self._torch, self.config
        h = np.asarray(self.history)
        first = self.bins.last_bin + 1 - len(h)
        feats = self._features(h, first)
        scale = max(float(np.mean(h)), 1e-6)
        starts = self._rng.integers(0, len(h) - c.window, size=c.batch)
        x = torch.tensor(np.stack([feats[s : s + c.window] for s in starts]), dtype=torch.float32)
        y = torch.tensor(h[starts + c.window] / scale, dtype=torch.float32)
        for _ in range(c.train_steps):
            out, _ = self.gru(x)
            loss = torch.nn.functional.mse_loss(self.head(out[:, -1]).squeeze(1), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        self.trained = True

    def predict(self, now_s: float, horizon_s: float) -> float | None:
        if not self.history:
            return self.bins.open_mean
        if not self.trained:
            return self.history[-1]
        c = self.config
        last = self.bins.last_bin  # clock bin of the newest closed one
        target = int((now_s + horizon_s) // c.step_s)
        ahead = max(1, min(target - last, 4 * c.window))
        if ahead not in self._cache:
            self._cache[ahead] = self._roll(ahead, last)
        return self._cache[ahead]

    def _roll(self, ahead: int, last: int) -> float:
        torch, c = self._torch, self.config
        values = list(self.history[-c.window :])
        scale = max(float(np.mean(self.history)), 1e-6)
        with torch.no_grad():
            for k in range(ahead):
                first = last + 1 + k - len(values)
                x = torch.tensor(
                    self._features(np.asarray(values), first)[None], dtype=torch.float32
                )
                out: Any
                out, _ = self.gru(x)
                values = [*values[1:], max(0.0, float(self.head(out[:, -1])) * scale)]
        return values[-1]
