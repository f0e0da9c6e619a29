"""The forecasters' history from Prometheus at start (`--forecast-history-url`): a freshly
started autoscaler knows no traffic, so the seasonal and learned forecasts would be blind for a
whole period (a day in production). Before the first tick the fleet's past arrival rate is read
with one range query (`/api/v1/query_range`, step = `--forecast-step`) and fed to every
forecaster in time order, as if the autoscaler had been running all along.

Prometheus's unix timestamps become the autoscaler's monotonic clock by their age,
t_mono = now_mono - (now_unix - t_unix), so the forecasters stay pure and unchanged. Anything
wrong (Prometheus unreachable, an error, no data) is one warning: the autoscaler starts without
history, never fails. Points that are not finite rates are skipped; a missing step is a gap,
which the forecasters' bins fill with the previous bin's mean (as for a scrape gap).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.forecast_bank import ForecastBank

log = logging.getLogger(__name__)

# Prometheus refuses a range query of more than 11,000 points per series: longer ones are cut.
MAX_POINTS_PER_QUERY = 10_000
MAX_HISTORY_BINS = 20_000  # what the seasonal and learned forecasters keep
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class HistoryConfig:
    url: str  # Prometheus's base URL, e.g. http://prometheus:9090
    query: str  # PromQL giving the fleet's arrivals per second (summed to one series)
    history_s: float  # how far back
    step_s: float  # the forecasters' bin width
    timeout_s: float = 10.0  # per request

    def __post_init__(self) -> None:
        if not self.history_s > 0 or not self.step_s > 0:
            raise ValueError("the history and its step must be > 0 seconds")


class HistoryError(Exception):
    """Prometheus could not give the history (the reason is the message)."""


def default_query(step_s: float) -> str:
    """The fleet's arrival rate as every `surge serve` exports it, averaged over a step (so a
    point is its bin's mean, as the live bins are) and never under a minute (a rate needs two
    scrapes in its window; the recording rule model_name:surge_requests_received:rate1m uses
    the same minute)."""
    window = max(60, math.ceil(step_s))
    return f"sum(rate(surge:requests_received_total[{window}s]))"


def default_history_s(config: AutoscalerConfig) -> float:
    """Enough for the forecaster to use: three periods when the period is given (two set the
    season up, the third checks it), else three days (a daily season found by autocorrelation
    needs a little over two); never more bins than the forecasters keep."""
    period = config.forecast_period_s
    wanted = 3 * period if period is not None else 3 * DAY_S
    return min(wanted, MAX_HISTORY_BINS * config.forecast_step_s)


def add_history_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("forecast history (the forecasters learn the past from Prometheus)")
    g.add_argument(
        "--forecast-history-url",
        default=None,
        metavar="URL",
        help="Prometheus's base URL (e.g. http://prometheus:9090): at start, the forecasters "
        "are fed the fleet's past arrival rate from it; unreachable or empty: a warning, and "
        "no history",
    )
    g.add_argument(
        "--forecast-history-query",
        default=None,
        metavar="PROMQL",
        help="the fleet's arrivals per second (default: "
        "sum(rate(surge:requests_received_total[max(1m, step)])))",
    )
    g.add_argument(
        "--forecast-history-s",
        type=_positive,
        default=None,
        help="seconds of history (default: 3 x --forecast-period, else 3 days; "
        "at most 20,000 x --forecast-step)",
    )


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def history_config(args: argparse.Namespace, config: AutoscalerConfig) -> HistoryConfig | None:
    """From the flags; None when no history is asked for or no forecast would use it."""
    if args.forecast_history_url is None:
        return None
    if config.forecast_horizon_s <= 0:
        log.warning(
            "--forecast-history-url: the forecast is off (--forecast-horizon 0): no history loaded"
        )
        return None
    step = config.forecast_step_s
    history_s = args.forecast_history_s or default_history_s(config)
    return HistoryConfig(
        args.forecast_history_url.rstrip("/"),
        args.forecast_history_query or default_query(step),
        min(history_s, MAX_HISTORY_BINS * step),
        step,
    )


def _parse_matrix(body: object) -> list[tuple[float, float]]:
    """A query_range answer's series, summed per timestamp (one series is the usual case)."""
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise HistoryError(f"Prometheus answered an error: {error or body!r:.300}")
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise HistoryError(f"expected a range vector (matrix), got {data.get('resultType')!r}")
    total: dict[float, float] = {}
    for series in data.get("result") or []:
        for t, v in series.get("values") or []:
            value = float(v)  # "NaN", "+Inf" parse; skipped later
            total[float(t)] = total.get(float(t), 0.0) + value
    return sorted(total.items())


async def fetch_history(
    client: httpx.AsyncClient, config: HistoryConfig, now_unix: float
) -> list[tuple[float, float]]:
    """(unix time, rate) of the last `history_s`, oldest first; raises HistoryError."""
    now_unix = math.floor(now_unix * 1000) / 1000  # as sent (ms): no point after now_unix
    start = now_unix - config.history_s
    points: list[tuple[float, float]] = []
    chunk_s = MAX_POINTS_PER_QUERY * config.step_s
    while start <= now_unix:
        end = min(now_unix, start + chunk_s)
        params = {
            "query": config.query,
            "start": f"{start:.3f}",
            "end": f"{end:.3f}",
            "step": f"{config.step_s:g}",
        }
        try:
            resp = await client.get(
                config.url + "/api/v1/query_range", params=params, timeout=config.timeout_s
            )
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise HistoryError(f"{config.url} unreachable: {type(e).__name__}: {e}") from None
        try:
            body = resp.json()
        except ValueError:
            raise HistoryError(f"{config.url} answered HTTP {resp.status_code}, not JSON") from None
        points += _parse_matrix(body)
        start = end + config.step_s
    return points


def backfill(
    bank: ForecastBank, points: Sequence[tuple[float, float]], now_mono: float, now_unix: float
) -> int:
    """Feed (unix time, rate) points to every forecaster of `bank`, oldest first, on the
    monotonic clock; returns how many were fed (non-finite, negative or future ones are
    skipped). Pure: both clocks are passed in."""
    past = [
        (now_mono - (now_unix - t), v)
        for t, v in sorted(points)
        if math.isfinite(v) and v >= 0 and t <= now_unix
    ]
    bank.seed(past, now_mono)
    return len(past)


async def load_history(
    bank: ForecastBank,
    config: HistoryConfig,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> int:
    """Fetch and backfill; the points loaded (0, with one warning, when there is no history)."""
    began = time.perf_counter()
    try:
        async with httpx.AsyncClient() as client:
            points = await fetch_history(client, config, wall())
    except HistoryError as e:
        log.warning("forecast history: %s; starting without history (query %s)", e, config.query)
        return 0
    loaded = backfill(bank, points, clock(), wall())
    if loaded == 0:
        log.warning(
            "forecast history: %s has no data for %s over the last %gs; starting without history",
            config.url,
            config.query,
            config.history_s,
        )
    else:
        log.info(
            "forecast history: %d points (%gs at %gs steps) loaded from %s in %.1fs",
            loaded,
            config.history_s,
            config.step_s,
            config.url,
            time.perf_counter() - began,
        )
    return loaded
