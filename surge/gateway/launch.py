"""Run the gateway: uvicorn around build_app, SIGHUP to re-read the upstreams file, a drain on
SIGTERM (not ready, new requests 503, in-flight ones finish; a second signal exits at once)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any

import uvicorn

from surge.gateway.app import build_app
from surge.gateway.config import GatewayConfig
from surge.gateway.state import GatewayState
from surge.http.draining_server import DrainingServer

log = logging.getLogger(__name__)


async def _drain_on_signal(server: DrainingServer, state: GatewayState) -> None:
    await server.drain_requested.wait()
    state.draining = True
    timeout = state.config.drain_timeout_s
    log.info("draining: %d requests in flight, up to %.0fs", state.limiter.in_flight, timeout)
    deadline = time.monotonic() + timeout
    while state.limiter.in_flight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)  # a stream counts until its last byte is sent
    if state.limiter.in_flight:
        log.warning("drain timeout: %d requests still in flight", state.limiter.in_flight)
    server.should_exit = True


async def _start_epp(state: GatewayState) -> Any:
    """The endpoint picker (Envoy ext_proc) over the gateway's own pool and balancers."""
    from surge.gateway.epp.picker import Picker  # grpcio: only when asked for
    from surge.gateway.epp.server import EppMetrics, start_server

    picker = Picker(state.config, state.pool, state.balancers)
    metrics = EppMetrics(state.metrics.registry)
    return await start_server(picker, state.config, metrics, lambda: not state.draining)


async def serve(config: GatewayConfig) -> int:
    """Serve until SIGTERM/Ctrl-C (uvicorn lets in-flight requests finish); the exit code."""
    app = build_app(config)
    state: GatewayState = app.state.gateway
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level="warning",
        access_log=config.log_requests,
        timeout_graceful_shutdown=10,
        timeout_keep_alive=30,
    )
    server = DrainingServer(uv_config)
    epp = await _start_epp(state) if config.epp.port is not None else None
    drain = asyncio.create_task(_drain_on_signal(server, state))
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # no SIGHUP on this platform
        loop.add_signal_handler(signal.SIGHUP, state.reload_now.set)
    urls = [u.url for u in state.pool.all()]
    log.info(
        "gateway on http://%s:%d, policy %s, upstreams %s%s%s",
        config.host,
        config.port,
        config.policy.value,
        urls,
        f" + file {config.upstreams_file}" if config.upstreams_file else "",
        f" + DNS {list(config.discover)}" if config.discover else "",
    )
    try:
        await server.serve()
    finally:
        drain.cancel()
        if epp is not None:
            await epp.stop(config.epp.grace_s)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGHUP)
    return 0 if server.started else 1
