"""Drivers: closed loop (N clients, each sends its next request when the last one ends) and open
loop (requests sent at the arrival process's times, whether or not earlier ones have finished).

NOTE: how a run ends (both loops)

    t0 ........ duration_s ........ duration_s + drain_s
    |-- send --|                    |
    |-- requests in flight finish --| cancelled here: `cancelled`, not an error

The run also ends, earlier, once `num_requests` have been sent and answered. Prompts are built
before waiting for their send time, so building them adds no lateness; what lateness remains
(`send_s - scheduled_s`) is the event loop's, and it is recorded.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

from surge.bench import arrivals, workload
from surge.bench.client import RequestRecord, build_request, new_record, send_into
from surge.bench.config import BenchConfig


@dataclass(slots=True)
class RunResult:
    config: BenchConfig
    records: list[RequestRecord]
    started_at: float  # wall clock (time.time()) at t0
    duration_s: float  # t0 to the last answer (or the cancellation)


def offsets_of(config: BenchConfig) -> Iterator[float] | None:
    """The run's send offsets; None for a closed loop."""
    a = config.arrival
    if a is None:
        return None
    if a.kind == "trace":
        assert config.workload.trace_path is not None
        return arrivals.trace(workload.trace_times(config.workload.trace_path), a.trace_speedup)
    return arrivals.arrivals(a, config.seed)


def make_client(config: BenchConfig) -> httpx.AsyncClient:
    # The pool must never be what limits concurrency: that would hide queueing inside httpx.
    size = config.concurrency or config.max_concurrency
    limits = httpx.Limits(
        max_connections=None if size is None else size + 8, max_keepalive_connections=size
    )
    timeout = httpx.Timeout(
        connect=config.connect_timeout_s,
        read=config.read_timeout_s,
        write=config.read_timeout_s,
        pool=None,
    )
    return httpx.AsyncClient(base_url=config.url, timeout=timeout, limits=limits)


async def run(
    config: BenchConfig,
    on_done: Callable[[RequestRecord], None] | None = None,
    records: list[RequestRecord] | None = None,
) -> RunResult:
    """Run `config` to its end; `on_done` sees each record as its request ends (progress).
    Records are appended to `records` as requests start, so a caller interrupted midway
    (Ctrl-C) still has them, those in flight marked cancelled."""
    records = [] if records is None else records
    async with make_client(config) as client:
        await _warm_up(client, config)
        started_at = time.time()
        t0 = time.perf_counter()
        offsets = offsets_of(config)
        prompts = workload.prompts(config.workload, config.seed)
        driver = _closed if offsets is None else _open
        await driver(client, config, t0, offsets, prompts, records, on_done or _nothing)
        return RunResult(config, records, started_at, time.perf_counter() - t0)


async def _warm_up(client: httpx.AsyncClient, config: BenchConfig) -> None:
    # Another seed: warm-up must not put the measured prompts (or prefixes) in the cache.
    prompts = workload.prompts(config.workload, config.seed + 1_000_003)
    for prompt in itertools.islice(prompts, config.num_warmup):
        record = new_record(prompt)
        req = build_request(prompt, config)
        await send_into(client, req, record, t0=0.0, timeout_s=config.request_timeout_s)


def _nothing(_: RequestRecord) -> None:
    pass


def _remaining(t0: float, at_s: float | None) -> float | None:
    return None if at_s is None else max(0.0, t0 + at_s - time.perf_counter())


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _finish(tasks: set[asyncio.Task[None]], t0: float, config: BenchConfig) -> None:
    """Wait for `tasks` until duration + drain, then cancel what is left; raise what a task
    raised (a bad dataset row). If the run itself is cancelled (Ctrl-C), cancel them first: none
    may outlive the HTTP client."""
    cancel_at = None if config.duration_s is None else config.duration_s + config.drain_s
    if not tasks:
        return
    try:
        done, pending = await asyncio.wait(tasks, timeout=_remaining(t0, cancel_at))
    except asyncio.CancelledError:
        await _cancel(tasks)
        raise
    await _cancel(pending)
    for task in done:
        if not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


async def _closed(
    client: httpx.AsyncClient,
    config: BenchConfig,
    t0: float,
    offsets: Iterator[float] | None,
    prompts: Iterator[workload.Prompt],
    records: list[RequestRecord],
    on_done: Callable[[RequestRecord], None],
) -> None:
    assert config.concurrency is not None
    todo = itertools.islice(prompts, config.num_requests)

    async def one_client() -> None:
        while config.duration_s is None or time.perf_counter() - t0 < config.duration_s:
            prompt = next(todo, None)  # one shared iterator: the clients take turns
            if prompt is None:
                return
            record = new_record(prompt)
            records.append(record)
            req = build_request(prompt, config)
            await send_into(client, req, record, t0=t0, timeout_s=config.request_timeout_s)
            on_done(record)

    tasks = {asyncio.create_task(one_client()) for _ in range(config.concurrency)}
    await _finish(tasks, t0, config)


async def _open(
    client: httpx.AsyncClient,
    config: BenchConfig,
    t0: float,
    offsets: Iterator[float] | None,
    prompts: Iterator[workload.Prompt],
    records: list[RequestRecord],
    on_done: Callable[[RequestRecord], None],
) -> None:
    assert offsets is not None
    slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    in_flight: set[asyncio.Task[None]] = set()

    async def one(record: RequestRecord, prompt: workload.Prompt) -> None:
        req = build_request(prompt, config)
        if slots is None:
            await send_into(client, req, record, t0=t0, timeout_s=config.request_timeout_s)
        else:
            try:
                async with slots:
                    await send_into(client, req, record, t0=t0, timeout_s=config.request_timeout_s)
            except asyncio.CancelledError:
                record.cancelled = True  # also when still waiting for a slot, never sent
                raise
        on_done(record)

    async def generate() -> None:
        for offset_s, prompt in itertools.islice(
            zip(offsets, prompts, strict=False), config.num_requests
        ):
            if config.duration_s is not None and offset_s >= config.duration_s:
                return
            await asyncio.sleep(max(0.0, t0 + offset_s - time.perf_counter()))
            record = new_record(prompt, scheduled_s=offset_s)
            records.append(record)
            task = asyncio.create_task(one(record, prompt))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)

    gen = asyncio.create_task(generate())
    try:
        # The generator stops by itself before duration_s; the cap is for a loop that lags.
        await _finish({gen}, t0, config)
        await _finish(set(in_flight), t0, config)
    except asyncio.CancelledError:
        await _cancel(set(in_flight))
        raise
