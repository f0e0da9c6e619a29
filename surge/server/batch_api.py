"""The Batch API on `surge serve`: lines go into this server's own app, in-process (an ASGI
transport: no socket, no second parse of HTTP), through the same routes, middleware and API-key
check as any request, marked as batch lines (lowest priority, their own admission pool).

Their pace follows the interactive queue: while interactive requests wait for a first token
the runner halves its lines in flight (surge/batch/throttle.py), down to a quarter of the most.
Inside each step the engine keeps the lines out of interactive requests' way itself (they sit
out an interactive prefill and take a bounded slice of each step: engine/core/background.py), so
the throttle only trims how many hold slots and blocks at a peak; below a quarter the engine's
slice would go unfed and the batch would lose the peaks' leftover."""

from __future__ import annotations

import logging
import time

import httpx
from fastapi import FastAPI

from surge.batch.service import BatchService, HttpSender
from surge.batch.throttle import Throttle
from surge.server.state import ServerState


def open_batch_service(state: ServerState, app: FastAPI) -> BatchService | None:
    """The service (started on the running loop), on `app.state.batch`; None when turned off."""
    config = state.config.batch
    if not config.enabled:
        return None
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per batch line
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    client = httpx.AsyncClient(transport=transport, base_url="http://surge-batch", timeout=None)
    floor = max(config.min_concurrency, config.max_concurrency // 4)
    throttle = Throttle(floor, config.max_concurrency)

    def capacity() -> int:
        return throttle.update(state.admission.pending_requests, time.monotonic())

    service = BatchService(
        config,
        config.data_path("serve", state.config.port),
        HttpSender(client),
        capacity,
        registry=state.metrics.registry,
        client=client,
    )
    app.state.batch = service
    service.start()
    return service
