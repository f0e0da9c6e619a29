"""The dynamic batcher on a real event loop, its batch function a plain Python function that
records what it was given. Time bounds are loose: a shared 2-core box is slow at times."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from surge.batching import BatcherConfig, BatchStats, DynamicBatcher, QueueFullError


class Recorder:
    """Doubles its inputs and remembers each batch (optionally slowly, like a model)."""

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.sleep_s = sleep_s
        self.threads: set[str] = set()

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.threads.add(threading.current_thread().name)
        time.sleep(self.sleep_s)
        return [2 * x for x in items]


async def _started(run: Recorder, config: BatcherConfig, **kw: object) -> DynamicBatcher[int, int]:
    batcher: DynamicBatcher[int, int] = DynamicBatcher(run, config, **kw)  # type: ignore[arg-type]
    batcher.start()
    return batcher


async def test_results_come_back_in_order_from_a_worker_thread() -> None:
    run = Recorder()
    batcher = await _started(run, BatcherConfig(max_batch_size=8, max_queue_delay_s=0.01))
    assert await batcher.submit_many([1, 2, 3]) == [2, 4, 6]
    assert await batcher.submit(7) == 14
    assert run.threads and all(name.startswith("surge-batcher") for name in run.threads)
    await batcher.close()


async def test_a_preferred_size_goes_out_without_waiting_for_the_delay() -> None:
    run = Recorder()
    batcher = await _started(
        run, BatcherConfig(max_batch_size=32, preferred_batch_sizes=(4,), max_queue_delay_s=30)
    )
    start = time.monotonic()
    assert await asyncio.wait_for(batcher.submit_many([1, 2, 3, 4]), 10) == [2, 4, 6, 8]
    assert time.monotonic() - start < 10
    assert run.batches == [[1, 2, 3, 4]]
    await batcher.close()


async def test_a_partial_batch_waits_the_queue_delay_then_goes_out_whole() -> None:
    run = Recorder()
    stats: list[BatchStats] = []
    batcher = await _started(
        run, BatcherConfig(max_batch_size=32, max_queue_delay_s=0.3), on_batch=stats.append
    )
    first = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.05)
    assert run.batches == []  # still waiting for company
    second = asyncio.ensure_future(batcher.submit_many([2, 3]))
    assert await first == 2 and await second == [4, 6]
    assert run.batches == [[1, 2, 3]]  # one batch: the later items joined the waiting one
    assert stats[0].size == 3 and max(stats[0].queue_wait_s) >= 0.29
    await batcher.close()


async def test_the_size_bound_splits_a_large_request() -> None:
    run = Recorder()
    batcher = await _started(run, BatcherConfig(max_batch_size=4, max_queue_delay_s=0.05))
    assert await batcher.submit_many(list(range(10))) == [2 * x for x in range(10)]
    assert [len(b) for b in run.batches] == [4, 4, 2]
    await batcher.close()


async def test_the_cost_bound_counts_padding() -> None:
    """Items are lengths; a batch costs count x longest, as padded inputs do."""
    run = Recorder()

    def padded(batch: list[int]) -> int:
        return len(batch) * max(batch)

    batcher = await _started(
        run,
        BatcherConfig(max_batch_size=32, max_queue_delay_s=0.05, max_batch_cost=10),
        batch_cost=padded,
    )
    await batcher.submit_many([2, 2, 8, 3])
    # [2, 2] costs 4; adding 8 would cost 24. [8] alone costs 8; [8, 3] would cost 16.
    assert run.batches == [[2, 2], [8], [3]]
    await batcher.close()


async def test_a_busy_model_batches_what_queued_meanwhile_even_without_delay() -> None:
    run = Recorder(sleep_s=0.3)
    batcher = await _started(run, BatcherConfig(max_batch_size=32, max_queue_delay_s=0.0))
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0.1)  # the first batch is running now
    rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 6)]
    await asyncio.gather(first, *rest)
    assert run.batches == [[0], [1, 2, 3, 4, 5]]
    await batcher.close()


async def test_a_full_queue_refuses_the_whole_request_and_keeps_what_it_has() -> None:
    run = Recorder(sleep_s=0.2)
    batcher = await _started(
        run, BatcherConfig(max_batch_size=1, max_queue_delay_s=0.0, max_queue_size=3)
    )
    running = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0.05)  # 0 is in the model; the queue is empty
    queued = asyncio.ensure_future(batcher.submit_many([1, 2]))
    await asyncio.sleep(0)
    with pytest.raises(QueueFullError) as info:
        batcher.enqueue([3, 4])  # 2 waiting + 2 > 3
    assert info.value.retry_after_s >= 1.0
    assert batcher.queue_depth == 2  # nothing of the refused request got in
    assert await running == 0 and await queued == [2, 4]
    assert run.batches == [[0], [1], [2]]
    await batcher.close()


async def test_a_failing_batch_fails_its_items_and_the_next_batch_still_runs() -> None:
    calls: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        calls.append(items)
        if -1 in items:
            raise ValueError("bad item")
        return items

    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        run, BatcherConfig(max_batch_size=8, max_queue_delay_s=0.0)
    )
    batcher.start()
    with pytest.raises(ValueError, match="bad item"):
        await batcher.submit_many([5, -1])
    assert await batcher.submit(3) == 3
    await batcher.close()


async def test_a_cancelled_caller_leaves_the_queue_before_its_batch_runs() -> None:
    run = Recorder(sleep_s=0.3)
    batcher = await _started(run, BatcherConfig(max_batch_size=32, max_queue_delay_s=0.0))
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0.1)  # running
    gone = asyncio.ensure_future(batcher.submit_many([1, 2]))
    stays = asyncio.ensure_future(batcher.submit(3))
    await asyncio.sleep(0.01)
    gone.cancel()  # the client disconnected
    assert await first == 0 and await stays == 6
    assert run.batches == [[0], [3]]
    await batcher.close()


async def test_close_fails_what_is_still_waiting() -> None:
    run = Recorder()
    batcher = await _started(run, BatcherConfig(max_batch_size=32, max_queue_delay_s=30))
    waiting = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.05)
    await batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        await waiting
    with pytest.raises(RuntimeError, match="closed"):
        batcher.enqueue([2])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_batch_size": 0},
        {"max_batch_size": 4, "preferred_batch_sizes": (8,)},
        {"max_queue_delay_s": -1},
        {"max_queue_size": 0},
        {"max_batch_cost": 0},
    ],
)
def test_config_refuses_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        BatcherConfig(**kwargs)  # type: ignore[arg-type]


async def test_close_during_a_batch_fails_its_items_instead_of_leaving_them_waiting() -> None:
    run = Recorder(sleep_s=0.5)
    batcher = await _started(run, BatcherConfig(max_batch_size=8, max_queue_delay_s=0.0))
    running = asyncio.ensure_future(batcher.submit(1))
    await asyncio.sleep(0.1)  # in the model now
    await batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(running, 5)
