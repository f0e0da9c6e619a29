"""Run the gateway: uvicorn around build_app, SIGHUP to re-read the upstreams file."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import uvicorn

from surge.gateway.app import GatewayState, build_app
from surge.gateway.config import GatewayConfig

log = logging.getLogger(__name__)


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
    server = uvicorn.Server(uv_config)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # no SIGHUP on this platform
        loop.add_signal_handler(signal.SIGHUP, state.reload_now.set)
    urls = [u.url for u in state.pool.all()]
    log.info("gateway on http://%s:%d, policy %s, upstreams %s%s", config.host, config.port,
             config.policy.value, urls,
             f" + file {config.upstreams_file}" if config.upstreams_file else "")  # fmt: skip
    try:
        await server.serve()
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGHUP)
    return 0 if server.started else 1
