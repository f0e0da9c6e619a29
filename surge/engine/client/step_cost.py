"""What one engine step costs by its shape: seconds = a + b * tokens + c * rows.

A CPU's step time grows with the batch (a step of 256 decode rows costs several times one of
16), so a single mean step time, measured on whatever steps ran recently, misjudges the wait in a
burst: the first steps are small. The engine measures a few steps of known shapes when it starts
(engine/core/calibrate.py) and reports the shape and time of every step it runs; this model fits the
three coefficients by least squares over the recent steps, pulled towards the start-up fit so that
a stretch of look-alike steps (all decode rows, where tokens = rows) cannot tip it. Pure: no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

StepSample = tuple[int, int, float]  # (tokens scheduled, rows (sequences), seconds)


class StepCostModel:
    def __init__(
        self,
        calibration: Sequence[StepSample] = (),
        window: int = 256,
        refit_every: int = 16,
        prior_weight: float = 32.0,
    ) -> None:
        self._recent: deque[StepSample] = deque(maxlen=window)
        self._since_fit = 0
        self._refit_every = refit_every
        self._calibration = [s for s in calibration if s[0] > 0 and s[2] > 0]
        self._prior_weight = prior_weight
        self._prior = _fit(self._calibration) if len(self._calibration) >= 3 else None
        self.coef: np.ndarray | None = self._prior

    def observe(self, samples: Iterable[StepSample]) -> None:
        for s in samples:
            if s[0] > 0 and s[2] > 0:
                self._recent.append(s)
                self._since_fit += 1
        if self._since_fit >= self._refit_every or (self.coef is None and len(self._recent) >= 3):
            self._refit()

    def _refit(self) -> None:
        self._since_fit = 0
        if self._prior is None:
            self.coef = _fit(list(self._recent)) if len(self._recent) >= 3 else None
            return
        # The calibration's steps weigh as `prior_weight` steps in all, however many it ran.
        w = self._prior_weight / len(self._calibration)
        samples = list(self._recent) + self._calibration
        weights = [1.0] * len(self._recent) + [w] * len(self._calibration)
        self.coef = _fit(samples, weights)

    @property
    def ready(self) -> bool:
        return self.coef is not None

    def seconds(self, tokens: int, rows: int) -> float:
        """A step of `tokens` scheduled tokens over `rows` sequences; 0 until fitted."""
        if self.coef is None:
            return 0.0
        a, b, c = self.coef
        return float(a + b * tokens + c * rows)


def _fit(samples: Sequence[StepSample], weights: Sequence[float] | None = None) -> np.ndarray:
    """Least squares with non-negative coefficients: a term that fits negative (collinear or
    noisy data) is dropped and the rest refitted, so a larger step never predicts less time."""
    x = np.array([[1.0, s[0], s[1]] for s in samples])
    y = np.array([s[2] for s in samples])
    if weights is not None:
        sw = np.sqrt(np.asarray(weights, dtype=float))
        x, y = x * sw[:, None], y * sw
    keep = [0, 1, 2]
    while True:
        scale = np.maximum(np.abs(x[:, keep]).max(axis=0), 1e-12)  # tokens ~ 1e3, rows ~ 1e2
        sol, *_ = np.linalg.lstsq(x[:, keep] / scale, y, rcond=None)
        sol = sol / scale
        if (sol >= 0).all() or len(keep) == 1:
            coef = np.zeros(3)
            coef[keep] = np.maximum(sol, 0.0)
            return coef
        keep = [k for k, v in zip(keep, sol, strict=True) if v >= 0] or [int(np.argmax(sol))]
