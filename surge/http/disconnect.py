"""Racing work against the client's disconnect, shared by the server and the gateway: a client
that leaves must abort its request at once (free the engine, or the upstream), not when the
answer is ready."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request


async def wait_disconnect(request: Request) -> None:
    """Return once the client has disconnected (what else arrives, body chunks, is skipped)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def done_before_disconnect(work: asyncio.Future[Any], request: Request) -> bool:
    """Wait for `work` or for the client to leave, whichever comes first: True when `work` is
    done (its result or exception is the caller's to read), False when the client left first
    (`work` still runs: the caller cancels it, its own way). If the wait itself is interrupted
    (cancelled, a timeout around it), `work` is cancelled too: no one is left to read it."""
    watcher = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        work.cancel()
        raise
    finally:
        watcher.cancel()
    return work.done()
