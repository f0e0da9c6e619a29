"""The event loop the servers run on: uvloop where installed (a dependency; the fallback keeps
a bare environment working). Its per-event cost is a fraction of asyncio's, and the API process
handles an event per streamed token on a machine whose cores the engine wants."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
