"""The gateway's fleet view as plain data, and the autoscaler's figures read over HTTP from a
real autoscaler metrics registry (prometheus_client's own server)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client import start_http_server

from surge.autoscale.decide import Decision
from surge.gateway.dashboard import autoscaler_figures, fleet_state
from surge.observability.autoscaler_metrics import AutoscalerMetrics
from tests.servers import free_port


def replica(url: str, kind: str, **figures: Any) -> dict[str, Any]:
    state = {"running": 1, "waiting": 0, "tokens_per_s": 10.0, "kv_usage": 0.5,
             "generation_tokens_total": 100.0, "requests_finished_total": 5.0,
             "ttft_p99_s": 0.2, "tpot_p99_s": 0.02, "prefix_hit_rate": None,
             "tenants": [{"tenant": "a", "tokens_per_s": 10.0, "share": 1.0}],
             "bottleneck": {"kind": kind, "reason": "why", "action": "do",
                            "evidence": {}}}  # fmt: skip
    state.update(figures)
    return {"url": url, "group": "primary", "healthy": True, "breaker": "closed",
            "in_flight": 1, "state": state, "error": None}  # fmt: skip


def test_fleet_totals_and_the_most_pressing_bottleneck() -> None:
    rows = [
        replica("http://a", "healthy", running=2, waiting=1, ttft_p99_s=0.9),
        replica("http://b", "kv_memory", kv_usage=0.9),
        replica("http://c", "compute"),
        {"url": "http://d", "group": "primary", "healthy": False, "breaker": "open",
         "in_flight": 0, "state": None, "error": "ConnectError"},
    ]  # fmt: skip
    s = fleet_state(rows, {"desired": 3.0, "ready": 2.0})
    assert s["kind"] == "fleet" and s["running"] == 4 and s["waiting"] == 1
    assert s["tokens_per_s"] == 30.0 and s["generation_tokens_total"] == 300.0
    assert s["ttft_p99_s"] == 0.9  # the worst replica's
    assert abs(s["kv_usage"] - (0.5 + 0.9 + 0.5) / 3) < 1e-9
    assert s["bottleneck"]["kind"] == "kv_memory" and "http://b" in s["bottleneck"]["reason"]
    assert s["tenants"] == [{"tenant": "a", "tokens_per_s": 30.0, "share": 1.0}]
    assert s["autoscaler"]["desired"] == 3.0
    assert fleet_state([], None)["bottleneck"]["kind"] == "idle"


def test_autoscaler_figures_from_its_metrics_port() -> None:
    metrics = AutoscalerMetrics()
    metrics.observe(ready=2, starting=1, draining=0, desired=3,
                    decision=Decision(3, "load", {"ongoing": 3}), forecast_rps=1.25,
                    previous=2)  # fmt: skip
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    try:

        async def read() -> dict[str, Any] | None:
            async with httpx.AsyncClient() as client:
                return await autoscaler_figures(client, f"http://127.0.0.1:{port}")

        found = asyncio.run(read())
        assert found == {"desired": 3.0, "forecast_rps": 1.25, "ready": 2.0, "starting": 1.0,
                         "draining": 0.0}  # fmt: skip

        async def nobody() -> dict[str, Any] | None:
            async with httpx.AsyncClient() as client:
                return await autoscaler_figures(client, f"http://127.0.0.1:{free_port()}")

        assert asyncio.run(nobody()) is None
    finally:
        server.shutdown()
        thread.join(5)
