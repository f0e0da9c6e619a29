"""BatchService: one process's Batch API (store, runner, metrics), and how lines are sent.

The server and the gateway each build one (surge/server/batch_api.py, surge/gateway/batch_api.py)
with their own Sender and capacity, and put it on `app.state.batch` for the routes. A data folder
that cannot be opened leaves the service unavailable (its routes answer 503 with the reason)
while the process goes on serving real-time traffic."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from surge.batch.config import BATCH_LINE_HEADER, BatchConfig
from surge.batch.lines import Claim
from surge.batch.metrics import BatchFigures, register
from surge.batch.runner import Answer, BatchRunner, Sender, SendError
from surge.batch.store import AsyncStore, StorageError, Store
from surge.http.deadline import TIMEOUT_HEADER

log = logging.getLogger(__name__)


def retry_after_s(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class HttpSender:
    """Sends a line to an OpenAI-compatible app through `client` (an in-process ASGI transport
    on the server), marked as a batch line, with the batch creator's own Authorization."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def __call__(self, c: Claim, timeout_s: float) -> Answer:
        headers = {
            "content-type": "application/json",
            BATCH_LINE_HEADER: "1",
            TIMEOUT_HEADER: f"{timeout_s:.3f}",
        }
        if c.auth:
            headers["authorization"] = c.auth
        try:
            async with asyncio.timeout(timeout_s + 10.0):  # the server answers 504 before this
                r = await self.client.post(c.endpoint, content=c.body.encode(), headers=headers)
        except (httpx.HTTPError, TimeoutError, OSError) as e:
            raise SendError(f"{type(e).__name__}: {e}") from e
        return Answer(
            r.status_code,
            r.content,
            r.headers.get("x-request-id", ""),
            retry_after_s(r.headers.get("retry-after")),
        )


class BatchService:
    def __init__(
        self,
        config: BatchConfig,
        path: Path,
        send: Sender,
        capacity: Callable[[], int],
        registry: CollectorRegistry | None = None,
        max_db_pages: int | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.config = config
        self.client = client  # the sender's, closed with the service
        self.path = path
        self.figures = BatchFigures()
        if registry is not None:
            register(self.figures, registry)
        self.astore: AsyncStore | None = None
        self.runner: BatchRunner | None = None
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None
        try:
            self.astore = AsyncStore(Store(path, max_db_pages))
        except StorageError as e:
            self.error = str(e)
            self.figures.storage_ok = False
            log.error("Batch API unavailable (real-time serving goes on): %s", e)
            return
        self.runner = BatchRunner(self.astore, send, config, self.figures, capacity)
        log.info("Batch API: data in %s", path)

    def start(self) -> None:
        """Start the runner on the running loop."""
        if self.runner is not None and self._task is None:
            self._task = asyncio.create_task(self.runner.run(), name="surge-batch-runner")

    def poke(self) -> None:
        """Something changed (a new batch, a cancel): look now rather than at the next tick."""
        if self.runner is not None:
            self.runner.wake.set()

    def summary(self) -> dict[str, Any]:
        """The figures /v1/dashboard/state and `surge top` show."""
        f = self.figures
        return {
            "available": self.astore is not None,
            "error": self.error,
            "storage_ok": f.storage_ok,
            "lines": dict(f.lines),
            "batches": dict(f.batches),
            "tokens_total": f.tokens,
            "lines_per_second": f.lines_per_second(time.monotonic()),
            "window_seconds_left": f.window_left_s,
            "concurrency_limit": f.concurrency_limit,
        }

    async def stop(self) -> None:
        """Stop running lines (those in flight run again at the next start)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def close(self) -> None:
        await self.stop()
        if self.client is not None:
            await self.client.aclose()
        if self.astore is not None:
            await self.astore.close()
            self.astore = None
