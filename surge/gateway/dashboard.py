"""The fleet's live view on the gateway: /dashboard (the same page as a replica's) and
/v1/dashboard/state, built from each upstream's own /v1/dashboard/state, the gateway's view of
it (rotation, breaker, in flight) and, with --autoscaler-url, the autoscaler's desired and ready
replicas and its forecast."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from surge.gateway.upstreams import Upstream, UpstreamPool
from surge.observability.dashboard_assets import asset
from surge.observability.scan import scan_metrics
from surge.observability.window import History, Snapshot

FETCH_TIMEOUT_S = 2.0
# Most pressing first: the fleet's bottleneck is the first of these any replica shows.
_ORDER = ("admission", "kv_memory", "api_process", "prefill", "compute", "healthy", "idle")
_AUTOSCALER = {
    "surge_autoscaler_desired_replicas": "desired",
    "surge_autoscaler_forecast_rps": "forecast_rps",
}
_SERIES = ("tokens_per_s", "running", "waiting", "kv_usage")
_BREAKER = {0: "closed", 1: "half_open", 2: "open"}


async def _replica(client: httpx.AsyncClient, u: Upstream, now_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "url": u.url,
        "group": u.group,
        "healthy": u.health.is_healthy(now_s),
        "breaker": _BREAKER.get(int(u.breaker.state(now_s)), "?"),
        "in_flight": u.in_flight,
        "state": None,
        "error": None,
    }
    try:
        r = await client.get(u.url + "/v1/dashboard/state", timeout=FETCH_TIMEOUT_S)
        if r.status_code == 200:
            state = r.json()
            state.pop("history", None)  # the fleet draws its own totals
            row["state"] = state
        else:
            row["error"] = f"HTTP {r.status_code}"
    except (httpx.HTTPError, ValueError) as e:
        row["error"] = type(e).__name__
    return row


async def autoscaler_figures(client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    """desired, ready/starting/draining and forecast_rps from an autoscaler's /metrics."""
    try:
        r = await client.get(url.rstrip("/") + "/metrics", timeout=FETCH_TIMEOUT_S)
        r.raise_for_status()
    except httpx.HTTPError:
        return None
    found: dict[str, Any] = scan_metrics(r.text, _AUTOSCALER)
    for state in ("ready", "starting", "draining"):
        name = f'surge_autoscaler_replicas{{state="{state}"}}'
        found[state] = next(
            (float(line.split()[-1]) for line in r.text.splitlines() if line.startswith(name)),
            None,
        )
    return found


def _sum(rows: list[dict[str, Any]], key: str) -> float:
    return sum(float(r["state"].get(key) or 0.0) for r in rows)


def _worst(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r["state"][key] for r in rows if r["state"].get(key) is not None]
    return max(values) if values else None


def fleet_state(
    replicas: list[dict[str, Any]], autoscaler: dict[str, Any] | None
) -> dict[str, Any]:
    """Totals over the replicas that answered; latency quantiles are the worst replica's (a
    fleet quantile cannot be rebuilt from theirs)."""
    live = [r for r in replicas if r["state"] is not None]
    kinds = {r["state"]["bottleneck"]["kind"]: r for r in reversed(live)}
    bottleneck = {"kind": "idle", "reason": "no replica answered", "action": "", "evidence": {}}
    for kind in _ORDER:
        if kind in kinds:
            b = dict(kinds[kind]["state"]["bottleneck"])
            b["reason"] = f"{kinds[kind]['url']}: {b['reason']}"
            bottleneck = b
            break
    tenants: dict[str, float] = {}
    for r in live:
        for t in r["state"].get("tenants", []):
            tenants[t["tenant"]] = tenants.get(t["tenant"], 0.0) + t["tokens_per_s"]
    total = sum(tenants.values())
    kv = [r["state"]["kv_usage"] for r in live]
    hits = [r["state"]["prefix_hit_rate"] for r in live if r["state"].get("prefix_hit_rate")]
    return {
        "kind": "fleet",
        "time": time.time(),
        "running": int(_sum(live, "running")),
        "waiting": int(_sum(live, "waiting")),
        "tokens_per_s": _sum(live, "tokens_per_s"),
        "requests_per_s": _sum(live, "requests_per_s"),
        "kv_usage": sum(kv) / len(kv) if kv else 0.0,
        "generation_tokens_total": _sum(live, "generation_tokens_total"),
        "requests_finished_total": _sum(live, "requests_finished_total"),
        "ttft_p50_s": _worst(live, "ttft_p50_s"),
        "ttft_p99_s": _worst(live, "ttft_p99_s"),
        "tpot_p50_s": _worst(live, "tpot_p50_s"),
        "tpot_p99_s": _worst(live, "tpot_p99_s"),
        "prefix_hit_rate": sum(hits) / len(hits) if hits else None,
        "bottleneck": bottleneck,
        "tenants": sorted(
            ({"tenant": t, "tokens_per_s": v, "share": v / total} for t, v in tenants.items()),
            key=lambda x: -x["share"],
        )
        if total > 0
        else [],
        "replicas": replicas,
        "autoscaler": autoscaler,
    }


class FleetView:
    def __init__(self, pool: UpstreamPool, autoscaler_url: str | None) -> None:
        self.pool = pool
        self.autoscaler_url = autoscaler_url
        self.history = History(120.0)

    async def state(self) -> dict[str, Any]:
        now_s = time.monotonic()
        async with httpx.AsyncClient() as client:
            rows = asyncio.gather(*(_replica(client, u, now_s) for u in self.pool.all()))
            url = self.autoscaler_url
            autoscaler = await autoscaler_figures(client, url) if url else None
            replicas = await rows
        state = fleet_state(replicas, autoscaler)
        latest = self.history.latest
        if latest is None or now_s - latest.t_s >= 0.5:  # several pages polling: one point
            gauges = {k: float(state[k]) for k in _SERIES}
            self.history.add(Snapshot(now_s, gauges=gauges))
        times = self.history.times()
        state["history"] = {"t": [round(t - times[0], 2) for t in times]} | {
            k: self.history.series(k) for k in _SERIES
        }
        return state


def install(app: FastAPI, pool: UpstreamPool, autoscaler_url: str | None) -> None:
    """Add the routes; call before the gateway's catch-all routes, which would take them."""
    view = FleetView(pool, autoscaler_url)

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> Response:
        return asset("dashboard.html")

    @app.get("/dashboard/{name}", include_in_schema=False)
    async def dashboard_asset(name: str) -> Response:
        return asset(name)

    @app.get("/v1/dashboard/state")
    async def dashboard_state() -> JSONResponse:
        state = await view.state()
        batch = getattr(app.state, "batch", None)  # the gateway's own Batch API (surge/batch)
        state["batch"] = batch.summary() if batch is not None else None
        return JSONResponse(state)
