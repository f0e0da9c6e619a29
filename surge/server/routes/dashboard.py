"""/dashboard (a live page), its JSON /v1/dashboard/state, and /v1/diagnosis: the bottleneck."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from surge.observability.dashboard_assets import asset
from surge.server.errors import NotFoundError
from surge.server.monitor import LiveMonitor
from surge.server.openapi import LOOKUP
from surge.server.state import get_state

router = APIRouter()


def _monitor(request: Request) -> LiveMonitor:
    monitor: LiveMonitor | None = getattr(request.app.state, "monitor", None)
    if monitor is None:
        raise NotFoundError("the live monitor is not running on this server")
    return monitor


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> Response:
    return asset("dashboard.html")


@router.get("/dashboard/{name}", include_in_schema=False)
async def dashboard_asset(name: str) -> Response:
    return asset(name)


@router.get("/v1/dashboard/state", responses=LOOKUP)
async def dashboard_state(request: Request) -> JSONResponse:
    name = get_state(request).config.served_model_name
    state = _monitor(request).state_json(time.monotonic(), name)
    batch = getattr(request.app.state, "batch", None)  # surge/batch: the Batch API's figures
    state["batch"] = batch.summary() if batch is not None else None
    return JSONResponse(state)


@router.get("/v1/diagnosis", responses=LOOKUP)
async def diagnosis(request: Request) -> JSONResponse:
    return JSONResponse(_monitor(request).diagnosis_json(time.monotonic()))
