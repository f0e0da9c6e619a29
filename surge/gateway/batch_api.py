"""The Batch API on `surge gateway`: the gateway keeps the files and batches (its own data
folder) and sends each line through its proxy path to the upstreams, least loaded first.

A line is a plain (non-streamed) request, so the proxy retries it on another upstream when its
upstream fails before answering (a replica killed mid-line included); a line it cannot place
returns to the runner, which runs it again later. Either way its output is recorded once.
Each line carries the batch line header, so every replica runs it at the lowest priority.
Lines in flight: --batch-max-concurrency per upstream in rotation."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from fastapi import FastAPI

from surge.batch.config import BATCH_LINE_HEADER
from surge.batch.lines import Claim
from surge.batch.runner import Answer
from surge.batch.service import BatchService, retry_after_s
from surge.batch.throttle import Throttle
from surge.gateway.balancers import LeastOutstanding
from surge.gateway.errors import GatewayError
from surge.gateway.proxy import Proxy, ProxyRequest
from surge.gateway.upstreams import FALLBACK, PRIMARY, RouteKey
from surge.http.request_id import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from surge.gateway.state import GatewayState


class ProxySender:
    """Sends a line through a Proxy of its own: the gateway's upstreams, breakers and client,
    a least-outstanding balancer and a retry budget apart from the interactive one."""

    def __init__(self, state: GatewayState) -> None:
        assert state.proxy is not None, "built in the lifespan, after the proxy"
        self.proxy = Proxy(
            state.config,
            state.pool,
            {PRIMARY: LeastOutstanding(), FALLBACK: LeastOutstanding()},
            state.proxy.client,
            state.metrics,
            tracing=state.tracing,
        )

    async def __call__(self, c: Claim, timeout_s: float) -> Answer:
        rid = uuid.uuid4().hex
        headers = {
            "content-type": "application/json",
            BATCH_LINE_HEADER: "1",
            REQUEST_ID_HEADER: rid,
        }
        if c.auth:
            headers["authorization"] = c.auth
        req = ProxyRequest(
            method="POST",
            path=c.endpoint,
            headers=headers,
            body=c.body.encode(),
            key=RouteKey(),
            stream=False,
            timeout_s=timeout_s,
        )
        try:
            response = await self.proxy.forward(req)
        except GatewayError as e:  # no upstream answered: the runner decides when to retry
            return Answer(
                e.status_code,
                bytes(e.response().body),
                rid,
                retry_after_s(e.headers.get("Retry-After")),
            )
        return Answer(
            response.status_code,
            bytes(response.body),
            response.headers.get(REQUEST_ID_HEADER, rid),
            retry_after_s(response.headers.get("retry-after")),
        )


def open_batch_service(state: GatewayState, app: FastAPI) -> BatchService | None:
    """The gateway's service, started on the running loop (call in the lifespan, once the proxy
    is built); None when turned off."""
    config = state.config.batch
    if not config.enabled:
        return None
    throttle = Throttle(config.min_concurrency, config.max_concurrency)

    def capacity() -> int:
        now_s = time.monotonic()
        serving = sum(1 for u in state.pool.all() if u.in_rotation(now_s))
        high = config.max_concurrency * max(1, serving)
        return throttle.update(state.limiter.num_waiting, now_s, high=high)

    service = BatchService(
        config,
        config.data_path("gateway", state.config.port),
        ProxySender(state),
        capacity,
        registry=state.metrics.registry,
    )
    app.state.batch = service
    service.start()
    return service
