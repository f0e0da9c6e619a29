"""DynamicBatcher: items submitted one by one from many requests leave as batches (Triton-style).

The batch function is synchronous (a model's forward pass) and runs on one worker thread, one
batch at a time, so the event loop never waits on it; torch releases the GIL inside its ops. When
a batch goes out is `BatcherConfig`'s rule: at once on reaching the size or cost bound or a
preferred size, else when the oldest item has waited the queue delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from surge.batching.config import BatcherConfig

T = TypeVar("T")
R = TypeVar("R")


class QueueFullError(Exception):
    """The queue cannot take these items now; try again after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class BatchStats:
    size: int
    cost: int
    queue_wait_s: tuple[float, ...]  # each item's time from submit to the batch's start
    run_s: float


@dataclass(slots=True)
class _Pending(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    enqueued_s: float


class DynamicBatcher(Generic[T, R]):
    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        config: BatcherConfig,
        batch_cost: Callable[[list[T]], int] | None = None,
        on_batch: Callable[[BatchStats], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._run_batch = run_batch
        self._batch_cost = batch_cost or len
        self._on_batch = on_batch
        self._clock = clock
        self._queue: deque[_Pending[T, R]] = deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="surge-batcher")
        self._task: asyncio.Task[None] | None = None
        self._running = 0  # items in the batch being run
        self._ewma_item_s = 0.0  # seconds of model time per item, for Retry-After
        self._closed = False

    # -- the caller's side ------------------------------------------------------------------

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    @property
    def queue_depth(self) -> int:
        """Items waiting, not counting the batch being run."""
        return sum(1 for p in self._queue if not p.future.done())

    @property
    def in_flight(self) -> int:
        return self.queue_depth + self._running

    def enqueue(self, items: Sequence[T]) -> list[asyncio.Future[R]]:
        """Queue all of `items` or none (QueueFullError): a request is never half-accepted."""
        if self._closed:
            raise RuntimeError("the batcher is closed")
        depth = self.queue_depth
        if depth + len(items) > self.config.max_queue_size:
            raise QueueFullError(
                f"queue is full ({depth} of {self.config.max_queue_size} waiting; "
                f"this request has {len(items)} inputs)",
                retry_after_s=self._retry_after_s(depth),
            )
        loop = asyncio.get_running_loop()
        now = self._clock()
        futures: list[asyncio.Future[R]] = []
        for item in items:
            future: asyncio.Future[R] = loop.create_future()
            self._queue.append(_Pending(item, future, now))
            futures.append(future)
        self._wakeup.set()
        return futures

    async def submit(self, item: T) -> R:
        return (await self.submit_many([item]))[0]

    async def submit_many(self, items: Sequence[T]) -> list[R]:
        """Results in the order of `items`. If the caller is cancelled (its client went away),
        its items still waiting are dropped from the queue."""
        futures = self.enqueue(items)
        try:
            return list(await asyncio.gather(*futures))
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    async def close(self) -> None:
        """Stop batching; items still waiting fail with RuntimeError."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._queue:
            p = self._queue.popleft()
            if not p.future.done():
                p.future.set_exception(RuntimeError("the batcher was closed"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- the batching loop ------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            batch = await self._next_batch()
            await self._run(batch)

    async def _next_batch(self) -> list[_Pending[T, R]]:
        cfg = self.config
        while True:
            live = [p for p in self._queue if not p.future.done()]  # not cancelled meanwhile
            if not live:
                self._queue.clear()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            n = self._fit(live)
            bound_reached = n == cfg.max_batch_size or n < len(live)
            preferred = max((s for s in cfg.preferred_batch_sizes if s <= n), default=0)
            wait_s = live[0].enqueued_s + cfg.max_queue_delay_s - self._clock()
            if bound_reached or wait_s <= 0:
                return self._take(n)
            if preferred:
                return self._take(preferred)
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=wait_s)

    def _fit(self, live: list[_Pending[T, R]]) -> int:
        """How many items from the head make a batch within the size and cost bounds (>= 1)."""
        n = min(len(live), self.config.max_batch_size)
        limit = self.config.max_batch_cost
        if limit is None:
            return n
        for k in range(2, n + 1):
            if self._batch_cost([p.item for p in live[:k]]) > limit:
                return k - 1
        return n

    def _take(self, n: int) -> list[_Pending[T, R]]:
        batch: list[_Pending[T, R]] = []
        while self._queue and len(batch) < n:
            p = self._queue.popleft()
            if not p.future.done():
                batch.append(p)
        return batch

    async def _run(self, batch: list[_Pending[T, R]]) -> None:
        items = [p.item for p in batch]
        started = self._clock()
        self._running = len(batch)
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, self._run_batch, items)
            if len(results) != len(items):
                raise RuntimeError(f"batch function gave {len(results)} results for {len(items)}")
        except asyncio.CancelledError:  # closed mid-batch: its callers must not wait forever
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(RuntimeError("the batcher was closed"))
            raise
        except Exception as e:  # each caller gets the error; the loop goes on
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        finally:
            self._running = 0
        run_s = self._clock() - started
        self._ewma_item_s = 0.8 * self._ewma_item_s + 0.2 * (run_s / len(batch))
        for p, r in zip(batch, results, strict=True):
            if not p.future.done():
                p.future.set_result(r)
        if self._on_batch is not None:
            waits = tuple(started - p.enqueued_s for p in batch)
            self._on_batch(BatchStats(len(batch), self._batch_cost(items), waits, run_s))

    def _retry_after_s(self, depth: int) -> float:
        """About when the queue has room again: its items at the recent time per item."""
        return max(1.0, depth * self._ewma_item_s)
