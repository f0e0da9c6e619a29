"""The forecasters on synthetic series with known answers, time passed in. Error bounds:

- a sinusoid (base 2, peak 20, period 1 h, one sample every 10 s) after 2.25 periods of history:
  seasonal predicts one period ahead within 10% of the peak's size at every point of the next
  period (Holt, without a season, misses by more than 30%); learned within 20%;
- a period of 1 h is detected within one bin (60 s);
- a step from 2 to 20: seasonal (no season yet) and Holt are within 10% of the new rate 10 bins
  (seasonal) / 10 samples (Holt) after it;
- Poisson noise around a flat rate of 10 makes the replica count asked for by the seasonal
  forecast change at most once per 100 decisions (bins of 10 s and the stabilizer's windows).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.decide import Stabilizer, desired_replicas
from surge.autoscale.forecasters import ForecastConfig, HoltAt, make_forecaster, peak_ahead
from surge.autoscale.seasonal import SeasonalConfig, SeasonalForecaster, detect_period
from surge.autoscale.signals import Signals

PERIOD = 3600.0
SPAN = 18.0  # peak - base


def sinus(t: float) -> float:
    return 2 + SPAN * (1 + math.sin(2 * math.pi * t / PERIOD)) / 2


def feed(f: object, times: np.ndarray, rate: object) -> None:
    for t in times:
        f.update(float(t), rate(float(t)))  # type: ignore[attr-defined, operator]


def worst_error_one_period_ahead(f: object, now_s: float) -> float:
    """Worst |forecast - truth| over the next period, as a fraction of the peak-to-base span."""
    errors = []
    for h in np.arange(0.0, PERIOD, 60.0):
        got = f.predict(now_s, float(h))  # type: ignore[attr-defined]
        assert got is not None
        errors.append(abs(got - sinus(now_s + h + 30)) / SPAN)  # a bin's middle
    return max(errors)


def test_seasonal_predicts_a_sinusoid_one_period_ahead_within_10_percent() -> None:
    f = SeasonalForecaster(SeasonalConfig(step_s=60.0))  # period detected
    times = np.arange(0.0, 2.25 * PERIOD + 1, 10.0)  # detection needs a little over 2 periods
    feed(f, times, sinus)
    assert f.period_s is not None and abs(f.period_s - PERIOD) <= 60
    assert worst_error_one_period_ahead(f, float(times[-1])) <= 0.10
    holt = HoltAt(0.5, 0.3)
    feed(holt, times, sinus)
    assert worst_error_one_period_ahead(holt, float(times[-1])) > 0.30  # what a season buys


def test_the_period_is_found_by_autocorrelation_and_noise_has_none() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(0, 300)
    assert detect_period(np.sin(2 * np.pi * t / 50) + 0.1 * rng.standard_normal(300)) == 50
    assert detect_period(rng.standard_normal(300)) is None


def test_learned_predicts_a_sinusoid_one_period_ahead_within_20_percent() -> None:
    pytest.importorskip("torch")
    f = make_forecaster(ForecastConfig("learned", step_s=60.0, period_s=PERIOD))
    assert f is not None
    times = np.arange(0.0, 4 * PERIOD + 1, 30.0)
    feed(f, times, sinus)
    # Checked at a few horizons (rolling a GRU forward is the slow part).
    now = float(times[-1])
    for h in (60.0, 600.0, 1800.0):
        got = f.predict(now, h)
        assert got is not None and abs(got - sinus(now + h + 30)) / SPAN <= 0.20, h


@pytest.mark.parametrize("kind", ["holt", "seasonal"])
def test_a_step_is_followed_within_10_bins(kind: str) -> None:
    f = make_forecaster(ForecastConfig(kind, step_s=10.0))
    assert f is not None
    times = np.arange(0.0, 2000.0, 10.0)

    def step(t: float) -> float:
        return 2.0 if t < 1000 else 20.0

    feed(f, times[times < 1000], step)
    before = f.predict(990.0, 10.0)
    assert before is not None and abs(before - 2.0) < 0.2
    feed(f, times[(times >= 1000) & (times <= 1100)], step)
    after = f.predict(1100.0, 10.0)
    assert after is not None and abs(after - 20.0) <= 2.0, after


def count_changes(kind: str) -> int:
    cfg = AutoscalerConfig(max_replicas=50, target_ongoing_per_replica=4.0)
    f = make_forecaster(ForecastConfig(kind, step_s=10.0))
    assert f is not None
    stab = Stabilizer(cfg)
    rng = np.random.default_rng(1)
    current, changes = 3, 0
    for k in range(1000):
        now = k * cfg.interval_s
        rate = rng.poisson(10.0 * cfg.interval_s) / cfg.interval_s  # 10 req/s, Poisson
        f.update(now, rate)
        forecast = peak_ahead(f, now, 30.0, 10.0)
        sig = Signals(current, 0.0, 10.0 * 1.0, 0.0, rate, 1.0)  # Little: 10 in the system
        target = stab.recommend(now, desired_replicas(sig, cfg, forecast, current).desired, current)
        changes += target != current
        current = target
    return changes


def test_noise_does_not_make_the_seasonal_replica_count_flap() -> None:
    assert count_changes("seasonal") <= 10  # at most once per 100 decisions
    # Holt's trend, looked 30 s ahead from 2 s samples, carries the noise into the count
    # (docs/autoscale.md): binning is what keeps the seasonal one still.
    assert count_changes("holt") > count_changes("seasonal")


def test_the_bank_exports_each_forecasters_prediction_and_error() -> None:
    from prometheus_client import generate_latest

    from surge.autoscale.forecast_bank import ForecastBank
    from surge.observability.autoscaler_metrics import AutoscalerMetrics

    cfg = AutoscalerConfig(forecaster="seasonal", forecast_horizon_s=10.0, forecast_step_s=10.0)
    bank = ForecastBank(cfg)
    for k in range(100):  # a ramp: 1 req/s more every 10 s
        chosen = bank.update(k * 2.0, 1.0 + k * 0.2)
    views = {v.name: v for v in bank.views()}
    assert set(views) == {"holt", "seasonal"} and chosen is not None
    # Holt follows a ramp exactly (error ~0); the seasonal one, binned and smoothed for noise
    # (alpha 0.2, beta 0.01), lags a ramp by a few bins: 2 req/s a bin, ~5 req/s behind.
    holt, seasonal = views["holt"].mean_abs_error_rps, views["seasonal"].mean_abs_error_rps
    assert holt is not None and holt < 0.1 and seasonal is not None and 1.0 < seasonal < 10.0
    metrics = AutoscalerMetrics()
    metrics.observe_forecasts(bank.views())
    text = generate_latest(metrics.registry).decode()
    assert 'surge_autoscaler_forecaster_abs_error_rps{forecaster="holt"}' in text
    assert 'surge_autoscaler_forecaster_rps{forecaster="seasonal"}' in text
    assert ForecastBank(AutoscalerConfig(forecast_horizon_s=0)).update(0.0, 5.0) is None
