"""uvicorn, except that the first exit signal (SIGTERM, Ctrl-C) asks for a drain instead of
closing the port: the probes must still answer during it (ready 503, live 200) while in-flight
requests finish. The server and the gateway each drain their own way when `drain_requested` is
set; a second signal is uvicorn's own forced exit."""

from __future__ import annotations

import asyncio
from types import FrameType

import uvicorn


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.drain_requested = asyncio.Event()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_requested.is_set():
            super().handle_exit(sig, frame)  # second signal: uvicorn's own (force) exit
            self.force_exit = True
            return
        self.drain_requested.set()
