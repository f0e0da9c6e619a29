"""A global and a per-API-key concurrency limit in front of the proxy, with a bounded queue: a
request waits for a slot up to a timeout, and is refused at once when the queue is full.

The queue is fair between keys: a freed slot goes to the waiter whose key has the fewest
requests in flight (arrival order among equals), so one client's burst of a thousand waits
behind nobody else's single request, and with a single key it is first come, first served.
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
    as soon as both limits admit it: of those they admit, the one whose key has the fewest in
    flight, the earliest among equals (waiters held back only by their own key's limit are
    skipped: one busy key must not block the others)."""

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
        while self._waiters and self.in_flight < self.config.max_concurrency:
            best: tuple[str, asyncio.Future[None]] | None = None
            for entry in self._waiters:
                key, future = entry
                if future.done() or not self._can_run(key):
                    continue  # cancelled (its owner removes it), or held by its key's limit
                if best is None or self._by_key.get(key, 0) < self._by_key.get(best[0], 0):
                    best = entry
            if best is None:
                return
            self._waiters.remove(best)
            self._take(best[0])
            best[1].set_result(None)
