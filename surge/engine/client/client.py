"""AsyncEngineClient: the API process's only view of the engine, which runs in its own process.

The event loop reads the engine's pipe itself (add_reader: no thread hop and wake-up per step,
which on a 2-core machine takes CPU from the engine's step); everything (detokenization, stop
strings, per-request queues) runs on the loop, single-threaded.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from surge.engine.client.output_processor import OutputProcessor, RequestDelta
from surge.engine.client.pipe_reader import PipeReader
from surge.engine.client.protocol import (
    Abort,
    AddRequests,
    Fatal,
    FromEngine,
    LoadLoRA,
    LoRAResult,
    Outputs,
    Ready,
    RequestFailed,
    Shutdown,
    ToEngine,
    UnloadLoRA,
)
from surge.engine.client.spawn import EngineDeadError, SpawnedEngine
from surge.engine.client.step_cost import StepCostModel
from surge.engine.stats import EngineStats
from surge.models.formats.tokenizer import Tokenizer
from surge.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineRequestError(ValueError):
    """The engine refused one request (e.g. it can never fit)."""


class RequestAbortedError(RuntimeError):
    """The request was aborted from outside its stream (e.g. by a timeout)."""


class LoRAUpdateError(ValueError):
    """The engine refused to load or unload a LoRA adapter; the message says why."""


@dataclass(frozen=True, slots=True)
class _Failure:
    error: Exception


class AsyncEngineClient:
    def __init__(
        self,
        tokenizer: Tokenizer,
        info: Ready,
        process: BaseProcess,
        to_engine: Connection,
        from_engine: Connection,
    ) -> None:
        self.tokenizer = tokenizer
        self.info = info
        self.max_model_len = info.max_model_len
        self._process = process
        self._to_engine = to_engine
        self._from_engine = from_engine
        self._processor = OutputProcessor(tokenizer)
        self._queues: dict[str, asyncio.Queue[RequestDelta | _Failure]] = {}
        self._stats = EngineStats(num_blocks=info.num_blocks, block_size=info.block_size)
        self._iteration_tokens: list[int] = []
        # What a step costs by its shape: admission's estimate of a request's wait.
        self.step_cost = StepCostModel(info.step_samples)
        self._send_lock = threading.Lock()
        self._loop = asyncio.get_running_loop()
        self.dead_reason: str | None = None
        self._closing = False
        self._on_dead: list[asyncio.Event] = []
        # LoRA adapters loaded in the engine (name -> path), as of its last answer.
        self.lora_adapters: dict[str, str] = dict(info.lora_adapters)
        self._lora_calls: dict[int, asyncio.Future[LoRAResult]] = {}
        self._call_ids = itertools.count(1)
        self._reader = PipeReader(from_engine.fileno())
        self._loop.add_reader(from_engine.fileno(), self._on_readable)

    # ---- start and stop --------------------------------------------------------------------
    @classmethod
    async def connect(
        cls, engine: SpawnedEngine, tokenizer: Tokenizer, startup_timeout_s: float = 600.0
    ) -> AsyncEngineClient:
        """Wait for an engine spawned earlier (spawn_engine) to be ready, and talk to it."""
        msg = await asyncio.to_thread(engine.wait_ready, startup_timeout_s)
        return cls(tokenizer, msg, engine.process, engine.to_engine, engine.from_engine)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def healthy(self) -> bool:
        return self.dead_reason is None and self._process.is_alive()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        self._closing = True
        if self._process.is_alive():
            self._send(Shutdown())
            await asyncio.to_thread(self._process.join, timeout_s)
        if self._process.is_alive():
            self._process.kill()
            await asyncio.to_thread(self._process.join, 5.0)

    def wait_dead(self) -> asyncio.Event:
        """An event set when the engine dies (for the server's supervisor task)."""
        ev = asyncio.Event()
        if self.dead_reason is not None:
            ev.set()
        self._on_dead.append(ev)
        return ev

    # ---- requests --------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """The latest engine snapshot (gauges and cumulative counters)."""
        return self._stats

    def take_stats(self) -> EngineStats:
        """The latest snapshot, with the tokens of every step since the previous call (for the
        iteration-tokens histogram: each engine message carries only its own step's)."""
        steps, self._iteration_tokens = self._iteration_tokens, []
        return replace(self._stats, iteration_tokens=steps)

    @property
    def num_in_flight(self) -> int:
        return len(self._queues)

    async def generate(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        tenant: str = "",
        cache_salt: str | None = None,
        arrival_s: float | None = None,
        on_queued: Callable[[float], None] | None = None,
        lora_name: str | None = None,
    ) -> AsyncGenerator[RequestDelta, None]:
        """Stream a request's deltas until it finishes. Closing the iterator aborts it."""
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        queue: asyncio.Queue[RequestDelta | _Failure] = asyncio.Queue()
        creqs = self._processor.add(
            req_id,
            prompt_token_ids,
            params,
            arrival_s=arrival_s if arrival_s is not None else time.monotonic(),
            priority=priority,
            tenant=tenant,
            cache_salt=cache_salt,
            lora_name=lora_name,
        )
        self._queues[req_id] = queue
        finished = False
        try:
            self._send(AddRequests(creqs))
            if on_queued is not None:
                on_queued(time.monotonic())
            while True:
                item = await queue.get()
                if isinstance(item, _Failure):
                    finished = True
                    raise item.error
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._queues.pop(req_id, None)
            if not finished:
                self.abort(req_id)

    def abort(self, req_id: str) -> None:
        """Stop a request at once; the engine frees its blocks. Unknown ids are ignored."""
        q = self._queues.pop(req_id, None)
        if q is not None:
            q.put_nowait(_Failure(RequestAbortedError(f"request {req_id} aborted")))
        live = self._processor.remove(req_id)
        if live and self.dead_reason is None:
            self._send(Abort(live))

    # ---- LoRA adapters -----------------------------------------------------------------------
    async def load_lora(self, name: str, path: str) -> None:
        """Load a PEFT adapter in the engine; LoRAUpdateError says why it could not be."""
        await self._lora_call(LoadLoRA(next(self._call_ids), name, path))

    async def unload_lora(self, name: str) -> None:
        await self._lora_call(UnloadLoRA(next(self._call_ids), name))

    async def _lora_call(self, msg: LoadLoRA | UnloadLoRA) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)
        future: asyncio.Future[LoRAResult] = self._loop.create_future()
        self._lora_calls[msg.call_id] = future
        try:
            self._send(msg)
            result = await future
        finally:
            self._lora_calls.pop(msg.call_id, None)
        if result.error is not None:
            raise LoRAUpdateError(result.error)

    # ---- engine messages -------------------------------------------------------------------
    def _send(self, msg: ToEngine) -> None:
        try:
            with self._send_lock:
                self._to_engine.send(msg)
        except (OSError, BrokenPipeError) as e:
            self._mark_dead(f"engine pipe closed: {e}")

    def _on_readable(self) -> None:
        """Every engine message complete so far (one bigger than the pipe's buffer may take
        several events: PipeReader keeps the part that has arrived)."""
        try:
            messages, closed = self._reader.read()
        except OSError:
            messages, closed = [], True
        for msg in messages:
            self._dispatch(msg)
            if isinstance(msg, Fatal):  # marked dead: nothing after it counts
                self._stop_reading()
                return
        if closed:
            self._stop_reading()
            self._mark_dead(f"engine process exited (code {self._process.exitcode})")

    def _stop_reading(self) -> None:
        self._loop.remove_reader(self._from_engine.fileno())  # False if already removed

    def _dispatch(self, msg: FromEngine) -> None:
        if isinstance(msg, Outputs):
            self._stats = msg.stats
            self.step_cost.observe(msg.stats.steps.samples)
            if len(self._iteration_tokens) < 100_000:  # bounded if nobody scrapes
                self._iteration_tokens.extend(tokens for tokens, _, _ in msg.stats.steps.samples)
            deltas, to_abort = self._processor.process(msg.outputs)
            if to_abort:
                self._send(Abort(to_abort))
            for rd in deltas:
                q = self._queues.get(rd.req_id)
                if q is not None:
                    q.put_nowait(rd)
        elif isinstance(msg, RequestFailed):
            parent = self._processor.parent_of(msg.req_id)
            if parent is None:
                return
            q = self._queues.pop(parent, None)
            self.abort(parent)
            if q is not None:
                q.put_nowait(_Failure(EngineRequestError(msg.message)))
        elif isinstance(msg, LoRAResult):
            self.lora_adapters = dict(msg.adapters)
            future = self._lora_calls.get(msg.call_id)
            if future is not None and not future.done():
                future.set_result(msg)
        elif isinstance(msg, Fatal):
            self._mark_dead(f"engine failed: {msg.message.strip().splitlines()[-1]}")

    def _mark_dead(self, reason: str) -> None:
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        if not self._closing:
            log.error("engine is dead: %s", reason)
        for req_id, q in list(self._queues.items()):
            q.put_nowait(_Failure(EngineDeadError(reason)))
            self._queues.pop(req_id, None)
        for ev in self._on_dead:
            ev.set()
        for future in self._lora_calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(reason))
