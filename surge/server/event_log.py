"""The events of streamed background responses, kept so that a client can read them again.

A background response created with `stream: true` runs whether or not its client stays: its
events go to a log, and each reader (the POST that made it, then any number of
`GET /v1/responses/{id}?stream=true&starting_after=N`) follows the log from a point, live until
the response ends. A client whose connection broke takes up the stream at the last sequence
number it saw, as OpenAI's API lets it. A log is kept while its response runs and, after, among
the last `keep_finished` finished ones (bounded: a long answer's log is ~300 bytes a token).
Used from the event loop only.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable


class EventLog:
    """One response's SSE events, in order: the event at index i has sequence number i."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.closed = False
        self._grew = asyncio.Event()

    def extend(self, events: Iterable[str]) -> None:
        before = len(self.events)
        self.events.extend(events)
        if len(self.events) > before:
            self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._grew.set()  # wakes the readers waiting on it; later ones wait on a fresh one
        self._grew = asyncio.Event()

    async def follow(self, after: int = -1) -> AsyncIterator[str]:
        """The events after sequence number `after`, then each new one, until the log closes."""
        i = max(after + 1, 0)
        while True:
            while i < len(self.events):
                yield self.events[i]
                i += 1
            if self.closed:
                return
            await self._grew.wait()


class EventLogs:
    """Logs by response id: those running, and the last `keep_finished` that ended."""

    def __init__(self, keep_finished: int = 100) -> None:
        self.keep_finished = keep_finished
        self._running: dict[str, EventLog] = {}
        self._finished: OrderedDict[str, EventLog] = OrderedDict()

    def open(self, response_id: str) -> EventLog:
        log = self._running[response_id] = EventLog()
        return log

    def get(self, response_id: str) -> EventLog | None:
        return self._running.get(response_id) or self._finished.get(response_id)

    def finish(self, response_id: str) -> None:
        """The response has ended: its log closes and joins the finished ones (the oldest go)."""
        log = self._running.pop(response_id, None)
        if log is None:
            return
        log.close()
        self._finished[response_id] = log
        while len(self._finished) > self.keep_finished:
            self._finished.popitem(last=False)

    def drop(self, response_id: str) -> None:
        """The response was deleted: its log goes (readers still following it end)."""
        for logs in (self._running, self._finished):
            log = logs.pop(response_id, None)
            if log is not None:
                log.close()
