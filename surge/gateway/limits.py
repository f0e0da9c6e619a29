"""A global and a per-API-key concurrency limit in front of the proxy, with a bounded FIFO
queue: a request waits for a slot up to a timeout, and is refused at once when the queue is full.
"""

from __future__ import annotations

import asyncio
from collections import deque

from surge.gateway.config import LimitConfig


class LimitExceeded(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # "queue_full" or "queue_timeout"


class ConcurrencyLimiter:
    """NOTE: invariant after every acquire/release: no waiter could run now. A waiter is woken
    as soon as both limits admit it, in arrival order, skipping waiters held back only by
    their own key's limit (one busy key must not block the others)."""

    def __init__(self, config: LimitConfig) -> None:
        self.config = config
        self.in_flight = 0
        self._by_key: dict[str, int] = {}
        self._waiters: deque[tuple[str, asyncio.Future[None]]] = deque()

    @property
    def num_waiting(self) -> int:
        return len(self._waiters)

    def _can_run(self, key: str) -> bool:
        per_key = self.config.max_concurrency_per_key
        return self.in_flight < self.config.max_concurrency and (
            per_key is None or self._by_key.get(key, 0) < per_key
        )

    def _take(self, key: str) -> None:
        self.in_flight += 1
        self._by_key[key] = self._by_key.get(key, 0) + 1

    async def acquire(self, key: str) -> None:
        """Take a slot for `key`, waiting up to queue_timeout_s; raises LimitExceeded."""
        if self._can_run(key):
            self._take(key)
            return
        if len(self._waiters) >= self.config.max_queue:
            raise LimitExceeded("queue_full")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (key, future)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.config.queue_timeout_s):
                await future
        except BaseException as e:
            if future.done() and not future.cancelled():
                self.release(key)  # granted just as we gave up: pass the slot on
            else:
                self._waiters.remove(entry)
            if isinstance(e, TimeoutError):
                raise LimitExceeded("queue_timeout") from None
            raise

    def release(self, key: str) -> None:
        self.in_flight -= 1
        left = self._by_key[key] - 1
        if left:
            self._by_key[key] = left
        else:
            del self._by_key[key]
        self._wake()

    def _wake(self) -> None:
        if not self._waiters or self.in_flight >= self.config.max_concurrency:
            return
        for entry in list(self._waiters):
            key, future = entry
            if self.in_flight >= self.config.max_concurrency:
                return
            if future.done():
                continue  # cancelled (timed out or the client left): its owner removes it
            if self._can_run(key):
                self._waiters.remove(entry)
                self._take(key)
                future.set_result(None)
