"""Scripted upstreams: real HTTP servers on 127.0.0.1 that fail on cue (500, 429, hang, stall,
die mid-stream), for the failure paths a healthy Surge server cannot be made to take. Servers
run in the test's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from tests.servers import free_port


@dataclass
class Script:
    """How one upstream behaves right now; tests change it between requests."""

    name: str
    mode: str = "ok"  # ok | status | hang | stall | die
    status: int = 500
    retry_after: str | None = None
    delay_s: float = 5.0
    healthy: bool = True
    num_waiting: int = 0
    num_requests: int = 0
    last_headers: dict[str, str] | None = None  # of the last completion request


def scripted_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if script.healthy else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(
            f'vllm:num_requests_waiting{{model_name="m"}} {script.num_waiting}\n'
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        script.num_requests += 1
        script.last_headers = dict(request.headers)
        body = await request.json()
        if script.mode == "status":
            headers = {"retry-after": script.retry_after} if script.retry_after else None
            err = {"message": f"{script.name} says {script.status}", "type": "x", "param": None,
                   "code": script.status}  # fmt: skip
            return JSONResponse({"error": err}, status_code=script.status, headers=headers)
        if script.mode == "hang":
            await asyncio.sleep(script.delay_s)
        if body.get("stream"):
            return StreamingResponse(_events(script), media_type="text/event-stream")
        return JSONResponse(
            {"choices": [{"index": 0, "text": script.name}], "upstream": script.name}
        )

    return app


async def _events(script: Script) -> AsyncIterator[str]:
    for i in range(3):
        yield f"data: {json.dumps({'choices': [{'index': 0, 'text': f'{script.name}{i}'}]})}\n\n"
        if script.mode == "stall":
            await asyncio.sleep(script.delay_s)
        if script.mode == "die" and i == 1:
            raise RuntimeError("the upstream dies mid-stream")  # uvicorn drops the connection
    yield "data: [DONE]\n\n"


class _InLoopServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # leave pytest's signal handlers alone


@contextlib.asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[str]:
    """Serve `app` on a free loopback port in this event loop; yields its base url."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                            timeout_graceful_shutdown=1)  # fmt: skip
    server = _InLoopServer(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("server did not start")
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
