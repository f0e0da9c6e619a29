"""Kubernetes probes of the gateway: live (the event loop answers), ready (it should get
traffic), startup (it has started). `/health` (app.py) stays as it was, with every upstream's
state, for people and for older probes."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

if TYPE_CHECKING:
    from surge.gateway.state import GatewayState


def readiness(state: GatewayState, now_s: float) -> tuple[bool, dict[str, Any]]:
    """Ready: not draining, and an upstream in rotation, or scale-to-zero's activation hold on
    (then a request waits for the first replica, and its wait is what wakes the autoscaler)."""
    in_rotation = sum(1 for u in state.pool.all() if u.in_rotation(now_s))
    body: dict[str, Any] = {"upstreams_in_rotation": in_rotation}
    if state.draining:
        return False, {"status": "draining", "reason": "draining", **body}
    if in_rotation:
        return True, {"status": "ok", **body}
    if state.config.activation_timeout_s > 0:
        return True, {"status": "activation_hold", **body}
    return False, {"status": "unavailable", "reason": "no upstream in rotation", **body}


def probe_router(state: GatewayState) -> APIRouter:
    router = APIRouter()

    @router.get("/health/live")
    async def live() -> JSONResponse:
        # Answering at all is the signal: a wedged loop times the probe out. 200 while draining.
        return JSONResponse({"status": "ok", "draining": state.draining})

    @router.get("/health/ready")
    async def ready() -> JSONResponse:
        ok, body = readiness(state, time.monotonic())
        return JSONResponse(body, status_code=200 if ok else 503)

    @router.get("/health/startup")
    async def startup() -> JSONResponse:
        # The port opens once the lifespan has started (DNS resolved once, tasks running).
        return JSONResponse({"status": "started"})

    return router
