"""The forecasters' history from a real Prometheus (Debian's binary): past data made with
`promtool tsdb create-blocks-from openmetrics` (the counter surge:requests_received_total of a
fleet whose arrival rate was a sinusoid, base 2, peak 20, period 1 h, over the last 3.5 hours),
read back with the default query. Error bound: right at start, with 3 periods of history, the
seasonal forecaster (period given) predicts every minute of the next period within 10% of the
sinusoid's span, the learned one within 20% at 1, 10 and 30 minutes (the bounds the live-fed
forecasters meet in test_forecasters.py); without the history they predict nothing. Then a
real `surge autoscale` (observe mode: no model to load) loads and exports the history, and
starts anyway, with one warning, when Prometheus is down.
Every process is stopped by its PID."""

from __future__ import annotations

import itertools
import logging
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.forecast_bank import ForecastBank
from surge.autoscale.history import (
    HistoryConfig,
    HistoryError,
    backfill,
    default_query,
    fetch_history,
    load_history,
)
from tests.autoscale.processes import AutoscaleProcess
from tests.observability.prom_process import PrometheusProcess, prometheus_holding_counter
from tests.servers import free_port

pytestmark = pytest.mark.timeout(60)

PERIOD = 3600.0
STEP = 60.0
SPAN = 18.0  # peak - base
BASE = 2.0
AMPLITUDE = SPAN / 2


def sinus(t: float) -> float:
    """The arrival rate at unix time t."""
    return BASE + AMPLITUDE * (1 + math.sin(2 * math.pi * t / PERIOD))


def received(t: float) -> float:
    """Requests received up to unix time t: the integral of sinus (a counter, >= 0)."""
    w = 2 * math.pi / PERIOD
    return (BASE + AMPLITUDE) * t - AMPLITUDE / w * math.cos(w * t) + 1e9


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    """A Prometheus holding 3.5 h of the fleet's counter, scraped every 15 s until now."""
    now = time.time()
    first = now - 3.5 * 3600
    prom = prometheus_holding_counter(
        tmp_path_factory.mktemp("history-prometheus"),
        'surge:requests_received_total{model_name="tiny"}',
        ((t, received(t) - received(first)) for t in np.arange(first, now, 15.0)),
    )
    yield prom
    prom.stop()


def seasonal_bank() -> ForecastBank:
    config = AutoscalerConfig(forecaster="seasonal", forecast_step_s=STEP,
                              forecast_period_s=PERIOD, forecast_horizon_s=STEP)  # fmt: skip
    return ForecastBank(config)


def history(url: str, query: str | None = None) -> HistoryConfig:
    return HistoryConfig(url, query or default_query(STEP), 3 * PERIOD, STEP)


def worst_error_one_period_ahead(bank: ForecastBank, now_mono: float, now_unix: float) -> float:
    """Worst |seasonal forecast - truth| over the next period, as a fraction of the span."""
    seasonal = next(t.forecaster for t in bank.tracked if t.name == "seasonal")
    errors = []
    for h in np.arange(0.0, PERIOD, STEP):
        got = seasonal.predict(now_mono, float(h))
        assert got is not None
        errors.append(abs(got - sinus(now_unix + h)) / SPAN)
    return max(errors)


async def test_backfilled_seasonal_forecast_is_right_one_period_ahead_at_start(
    prometheus: PrometheusProcess,
) -> None:
    now_unix = time.time()
    async with httpx.AsyncClient() as client:
        points = await fetch_history(client, history(prometheus.url), now_unix)
    # One point a step over 3 h; the last minute or so may lack a rate (no newer samples).
    assert 175 <= len(points) <= 181, len(points)
    assert all(b - a == pytest.approx(STEP) for (a, _), (b, _) in itertools.pairwise(points))

    fresh = seasonal_bank()
    assert [v.predicted_rps for v in fresh.views()] == [None, None]  # no history, no forecast
    now_mono = 5_000.0  # any monotonic reading: only the points' ages carry over
    bank = seasonal_bank()
    assert backfill(bank, points, now_mono, now_unix) == len(points)
    assert all(v.predicted_rps is not None for v in bank.views())
    assert worst_error_one_period_ahead(bank, now_mono, now_unix) <= 0.10


async def test_backfilled_learned_forecast_is_within_20_percent_at_start(
    prometheus: PrometheusProcess,
) -> None:
    """The GRU trains once on the whole history (its training is capped while seeding)."""
    pytest.importorskip("torch")
    now_unix = time.time()
    async with httpx.AsyncClient() as client:
        points = await fetch_history(client, history(prometheus.url), now_unix)
    config = AutoscalerConfig(forecaster="learned", forecast_step_s=STEP,
                              forecast_period_s=PERIOD, forecast_horizon_s=STEP)  # fmt: skip
    bank, now_mono = ForecastBank(config), 5_000.0
    backfill(bank, points, now_mono, now_unix)
    learned = next(t.forecaster for t in bank.tracked if t.name == "learned")
    assert learned.trained  # type: ignore[attr-defined]
    for h in (60.0, 600.0, 1800.0):  # rolling the GRU forward is the slow part
        got = learned.predict(now_mono, h)
        assert got is not None and abs(got - sinus(now_unix + h)) / SPAN <= 0.20, h


async def test_a_long_history_is_read_in_queries_prometheus_accepts(
    prometheus: PrometheusProcess,
) -> None:
    """3.4 h at 1 s steps is 12,240 points, over Prometheus's cap of 11,000 a query (one query
    is refused): two queries, each point once, on one grid."""
    config = HistoryConfig(prometheus.url, default_query(1.0), 3.4 * 3600, 1.0)
    async with httpx.AsyncClient() as client:
        points = await fetch_history(client, config, time.time())
    assert len(points) >= 12_100, len(points)
    assert all(b - a == pytest.approx(1.0) for (a, _), (b, _) in itertools.pairwise(points))


def test_backfill_skips_what_is_not_a_rate_and_keeps_the_ages() -> None:
    bank = ForecastBank(AutoscalerConfig(forecaster="holt"))
    now_unix, now_mono = 1_700_000_000.0, 100.0
    points = [
        (now_unix - 30, 4.0),
        (now_unix - 90, 2.0),  # out of order: sorted
        (now_unix - 60, math.nan),
        (now_unix - 50, math.inf),
        (now_unix - 40, -1.0),
        (now_unix + 10, 9.0),  # the future
    ]
    assert backfill(bank, points, now_mono, now_unix) == 2
    holt = next(t.forecaster for t in bank.tracked if t.name == "holt")
    assert holt.holt.last_s == pytest.approx(now_mono - 30)  # type: ignore[attr-defined]
    assert holt.holt.level == pytest.approx(3.0)  # type: ignore[attr-defined]  # 2, then 4 (alpha 0.5)


async def test_no_history_is_one_warning_and_nothing_loaded(
    prometheus: PrometheusProcess, caplog: pytest.LogCaptureFixture
) -> None:
    async with httpx.AsyncClient() as client:
        with pytest.raises(HistoryError, match="parse error"):
            await fetch_history(client, history(prometheus.url, "sum(rate("), time.time())
    cases = {
        "unreachable": history(f"http://127.0.0.1:{free_port()}"),
        "no data for": history(prometheus.url, "sum(rate(no_such_metric_total[1m]))"),
        "parse error": history(prometheus.url, "sum(rate("),
    }
    for words, config in cases.items():
        caplog.clear()
        bank = seasonal_bank()
        with caplog.at_level(logging.WARNING, logger="surge.autoscale.history"):
            assert await load_history(bank, config) == 0
        (record,) = caplog.records
        assert words in record.getMessage() and "without history" in record.getMessage()
        assert [v.predicted_rps for v in bank.views()] == [None, None]


def metric(proc: AutoscaleProcess, name: str) -> float | None:
    try:
        text = httpx.get(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    lines = [x for x in text.splitlines() if x.startswith(name + " ") or x.startswith(name + "{")]
    return float(lines[0].split()[-1]) if lines else None


def observer(log_path: Path, url: str) -> AutoscaleProcess:
    """`surge autoscale` in observe mode on a replica nobody serves: nothing to load."""
    return AutoscaleProcess(
        log_path, "--upstream", f"http://127.0.0.1:{free_port()}", "--interval", "0.5",
        "--forecaster", "seasonal", "--forecast-step", str(STEP),
        "--forecast-period", str(PERIOD), "--forecast-horizon", str(STEP),
        "--forecast-history-url", url,
    )  # fmt: skip


def wait_for_metric(proc: AutoscaleProcess, name: str, timeout_s: float = 25.0) -> float:
    """The history gauge once the load has been logged and the gauge agrees with the log.

    The log line comes from inside the load and the gauge is set after it returns, so a
    scrape between the two reads 0: wait for the logged count, not for the first scrape.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, proc.log()
        log = proc.log()
        logged = re.search(r"forecast history: (\d+) points", log)
        expected = int(logged.group(1)) if logged else 0 if "without history" in log else None
        value = metric(proc, name)
        if expected is not None and value == expected:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{name} not exported as logged in {timeout_s}s\n{proc.log()}")


def test_surge_autoscale_loads_the_history_and_exports_it(
    prometheus: PrometheusProcess, tmp_path: Path
) -> None:
    proc = observer(tmp_path / "autoscale.log", prometheus.url)
    try:
        points = wait_for_metric(proc, "surge_autoscaler_forecast_history_points")
        assert 175 <= points <= 181, proc.log()
        assert f"forecast history: {points:.0f} points" in proc.log()
        # The seasonal forecast at the horizon, before any live rate: the sinusoid's.
        predicted = metric(proc, 'surge_autoscaler_forecaster_rps{forecaster="seasonal"}')
        assert predicted is not None, proc.log()
        assert abs(predicted - sinus(time.time() + STEP)) <= 0.10 * SPAN
    finally:
        assert proc.stop() == 0, proc.log()


def test_surge_autoscale_starts_without_history_when_prometheus_is_down(tmp_path: Path) -> None:
    proc = observer(tmp_path / "autoscale.log", f"http://127.0.0.1:{free_port()}")
    try:
        assert wait_for_metric(proc, "surge_autoscaler_forecast_history_points") == 0
        assert "WARNING" in proc.log() and "starting without history" in proc.log()
        time.sleep(1.0)  # a few ticks: it keeps running
        assert proc.proc.poll() is None, proc.log()
    finally:
        assert proc.stop() == 0, proc.log()
