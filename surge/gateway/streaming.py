"""Relay an upstream's SSE stream to the client, chunk by chunk.

Once a byte has gone to the client a request can no longer start over on another upstream, so
a stream that breaks (connection lost, idle timeout, no last event) is never replayed. A plain
text answer is continued instead, once, by another upstream from where it stopped
(`resume.py`); any other ends with an error event in the OpenAI shape and `data: [DONE]`. Only
whole events are forwarded, so the client never sees half an event followed by the error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Protocol

import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from surge.gateway.breaker import Outcome
from surge.gateway.errors import SSE_DONE, BadGateway, GatewayError, GatewayTimeout
from surge.gateway.resume import StreamResume

# Given the broken stream's tracker: the stream that continues it, the final events when
# nothing is left to generate, or None (then the client gets the error).
Resumer = Callable[[StreamResume], Awaitable["RelayStream | bytes | None"]]

# A stream ends whole with one of these: chat and completions with [DONE]; the Responses API,
# which sends no [DONE], with its response's last event (or an error event).
LAST_EVENTS = (
    b"data: [DONE]",
    b"event: response.completed",
    b"event: response.incomplete",
    b"event: response.failed",
    b"event: error",
)


def ends_stream(events: bytes) -> bool:
    """Whether these whole events hold a stream's last event (at the start of a line)."""
    return any(events.startswith(m) or b"\n" + m in events for m in LAST_EVENTS)


class Finisher(Protocol):
    def finish(self, outcome: Outcome | None, kind: str = "") -> None:
        """Release the upstream exactly once: success, failure (of `kind`), or None when the
        client went away first (no verdict on the upstream)."""
        ...


def split_events(data: bytes) -> tuple[bytes, bytes]:
    """(complete events, the unfinished rest) of SSE bytes."""
    cut = 0
    for sep in (b"\n\n", b"\r\n\r\n"):
        i = data.rfind(sep)
        if i >= 0:
            cut = max(cut, i + len(sep))
    return data[:cut], data[cut:]


class RelayStream(StreamingResponse):
    """The client's response for one upstream SSE stream whose first chunk has arrived.

    Cleanup (closing the upstream response, releasing the upstream, `on_close` callbacks such as
    the concurrency slot) runs when the response ends for any reason, even when the client
    disconnects before the body starts and the body generator never runs.
    """

    def __init__(
        self,
        upstream: httpx.Response,
        chunks: AsyncIterator[bytes],
        first: bytes,
        lease: Finisher,
        *,
        idle_s: float,
        deadline_s: float,
        clock: Callable[[], float],
        headers: dict[str, str],
        tracker: StreamResume | None = None,
        resumer: Resumer | None = None,
    ) -> None:
        self._upstream = upstream
        self._chunks = chunks
        self._lease = lease
        self._idle_s = idle_s
        self._deadline_s = deadline_s
        self._clock = clock
        self._outcome: Outcome | None = None
        self._kind = ""
        self._closed = False
        self._on_close: list[Callable[[], None]] = []
        self._tracker, self._resumer = tracker, resumer
        self._gen = self._relay(first)
        super().__init__(self._gen, status_code=upstream.status_code, headers=headers)

    def add_on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._gen.aclose()
            await self._upstream.aclose()
        finally:
            self._lease.finish(self._outcome, self._kind)
            for callback in self._on_close:
                callback()

    async def _next_chunk(self) -> bytes | None:
        """The next upstream chunk, None at its end; raises TimeoutError or httpx errors."""
        remaining = self._deadline_s - self._clock()
        idle = self._idle_s < remaining
        if remaining <= 0:
            raise TimeoutError("total")
        try:
            async with asyncio.timeout(min(self._idle_s, remaining)):
                return await anext(self._chunks)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise TimeoutError("idle" if idle else "total") from None

    async def _relay(self, first: bytes) -> AsyncGenerator[bytes, None]:
        ready, pending = split_events(first)
        saw_done = ends_stream(ready)
        if ready:
            self._observe(ready)
            yield ready
        error: GatewayError | None = None
        may_resume = True  # not at the total deadline: no one waits for more then
        try:
            while (chunk := await self._next_chunk()) is not None:
                ready, pending = split_events(pending + chunk)
                if ready:
                    saw_done = saw_done or ends_stream(ready)
                    self._observe(ready)
                    yield ready
        except TimeoutError as e:
            # An idle upstream is stuck; a stream still flowing at the total deadline is not
            # the upstream's fault (it was asked for a long answer).
            idle = may_resume = str(e) == "idle"
            self._fail("idle_timeout" if idle else "timeout", Outcome.FAILURE if idle else None)
            error = GatewayTimeout(f"upstream stream timed out ({e} timeout)", code="timeout")
        except httpx.HTTPError as e:
            self._fail("stream_broken")
            error = BadGateway(f"upstream stream broke: {e!r}", code="upstream_stream_broken")
        else:
            if saw_done or ends_stream(pending):
                if pending:
                    yield pending
                self._outcome = Outcome.SUCCESS
                return
            self._fail("stream_truncated")
            error = BadGateway("upstream ended the stream early", code="upstream_stream_broken")
        # The half event in `pending` is dropped: the client gets whole events only.
        tracker = self._tracker
        if may_resume and self._resumer is not None and tracker is not None and tracker.resumable:
            # This upstream is done with: its verdict now, not when the continuation ends.
            self._lease.finish(self._outcome, self._kind)
            await self._upstream.aclose()
            rest = await self._resumer(tracker)
            if isinstance(rest, bytes):
                yield rest
                return
            if rest is not None:
                try:
                    async for data in rest._gen:
                        yield tracker.rewrite(data)
                finally:
                    await rest.close()
                return
        yield error.sse_event().encode()
        yield SSE_DONE

    def _observe(self, events: bytes) -> None:
        if self._tracker is not None:
            self._tracker.observe(events)

    def _fail(self, kind: str, outcome: Outcome | None = Outcome.FAILURE) -> None:
        self._outcome = outcome
        self._kind = kind
