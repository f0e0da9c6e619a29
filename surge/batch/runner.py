"""The worker loop: validate new batches, run their lines through an OpenAI-compatible endpoint
with bounded concurrency, record each answer as it comes, and end batches (completed, expired,
cancelled) by writing their output and error files.

NOTE: one line's path

    claim (pending -> in_flight, earliest window first)
    send (Sender: the server's own app in-process, or the gateway's proxy), timeout = the
        line timeout or the window left, whichever ends first
    2xx                       -> output file line               (record)
    4xx but 429               -> error file line, the answer    (record: the request's fault)
    429/503 (refused)         -> back to pending after a pause, the try not counted
    5xx, timeout, transport   -> back to pending after a backoff, the try counted; after
                                 max_attempts, an error file line
    cancelled (batch cancel, window end, shutdown) -> nothing recorded: the line is closed with
        the batch, or runs again after a restart
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from surge.batch import lines as L
from surge.batch.config import BatchConfig
from surge.batch.metrics import BatchFigures
from surge.batch.records import ACTIVE, BatchRow, error_line, response_line
from surge.batch.store import AsyncStore, StorageError
from surge.batch.validate import parse_lines

log = logging.getLogger(__name__)

TICK_S = 0.2
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    request_id: str = ""
    retry_after_s: float | None = None


class SendError(Exception):
    """The line got no answer (connection refused or reset, a replica gone)."""


Sender = Callable[[L.Claim, float], Awaitable[Answer]]


def usage_of(body: Any) -> L.Usage:
    """Token counts from an answer's `usage` (chat/completions, embeddings or Responses)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return L.Usage()

    def num(*names: str) -> int:
        for n in names:
            if isinstance(v := usage.get(n), int):
                return v
        return 0

    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    return L.Usage(
        num("prompt_tokens", "input_tokens"),
        num("completion_tokens", "output_tokens"),
        cached if isinstance(cached, int) else 0,
    )


class BatchRunner:
    def __init__(
        self,
        astore: AsyncStore,
        send: Sender,
        config: BatchConfig,
        figures: BatchFigures,
        capacity: Callable[[], int],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.astore = astore
        self.store = astore.store
        self.send = send
        self.config = config
        self.figures = figures
        self.capacity = capacity
        self.clock = clock
        self.wake = asyncio.Event()
        self.tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._unsaved: list[tuple[L.Claim, bool, str, L.Usage]] = []  # answers not yet stored
        self._refreshed_s = 0.0

    async def run(self) -> None:
        """Until cancelled. A storage error pauses the loop (it retries every few seconds);
        nothing else stops it."""
        recovered = await self.astore.call(L.recover, self.store)
        swept = await self.astore.call(self.store.sweep_orphans)
        if recovered or swept:
            log.info(
                "batch: %d lines in flight at the last stop run again; %d stray files removed",
                recovered,
                swept,
            )
        try:
            while True:
                try:
                    await self.tick()
                    self.figures.storage_ok = True
                except StorageError as e:
                    self.figures.storage_ok = False
                    log.error("batch runner paused: %s", e)
                    await asyncio.sleep(5.0)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TICK_S):
                        await self.wake.wait()
                self.wake.clear()
        finally:
            await self.stop_lines()

    async def stop_lines(self) -> None:
        """Cancel every line in flight (they stay in flight in the store: a restart runs them)."""
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def tick(self) -> None:
        now = self.clock()
        await self._save_unsaved()
        for b in await self.astore.call(self.store.batches_in, ACTIVE):
            if b.status == "validating":
                await self._validate(b)
            elif b.status == "cancelling":
                await self._end(
                    b,
                    "cancelled",
                    "batch_cancelled",
                    "the batch was cancelled before this request ran",
                )
            elif b.status == "finalizing":
                await self._finish(b)
            elif b.expires_at <= now:
                await self._end(
                    b,
                    "expired",
                    "batch_expired",
                    "the batch's completion window "
                    f"({b.completion_window}) ended before this request ran",
                )
            elif not self._in_flight(b.id) and not await self.astore.call(
                L.open_lines, self.store, b.id
            ):
                await self._finish(b)
        if not self._unsaved:
            await self._fill(now)
        if time.monotonic() - self._refreshed_s >= 1.0:
            await self._refresh(now)

    # ---- batches -----------------------------------------------------------------------
    async def _validate(self, b: BatchRow) -> None:
        now = int(self.clock())
        if await self.astore.call(self.store.get_file, b.owner, b.input_file_id) is None:
            await self.astore.call(
                self.store.fail_batch,
                b.id,
                "input_file_missing",
                f"input file {b.input_file_id} was deleted",
                now,
            )
            return
        path = self.store.file_path(b.input_file_id)
        try:
            parsed = await asyncio.to_thread(lambda: parse_lines(path.read_bytes(), b.endpoint))
        except (OSError, UnicodeDecodeError) as e:
            await self.astore.call(
                self.store.fail_batch,
                b.id,
                "input_file_unreadable",
                f"input file {b.input_file_id}: {e}",
                now,
            )
            return
        rows = [
            (
                i,
                ln.custom_id,
                ln.body,
                None if ln.ok else error_line(ln.custom_id, str(ln.code), str(ln.message)),
            )
            for i, ln in enumerate(parsed)
        ]
        errors = [
            {"code": ln.code, "message": ln.message, "line": ln.number, "param": None}
            for ln in parsed
            if not ln.ok
        ]
        await self.astore.call(self.store.set_lines, b.id, rows, errors, now)
        log.info("batch %s: %d lines, %d refused at validation", b.id, len(rows), len(errors))

    async def _end(self, b: BatchRow, status: str, code: str, message: str) -> None:
        """End a batch early: its lines in flight are stopped, and every line not done goes to
        the error file with `code`."""
        mine = [t for (bid, _), t in self.tasks.items() if bid == b.id]
        for t in mine:
            t.cancel()
        await asyncio.gather(*mine, return_exceptions=True)
        closed = await self.astore.call(L.close_open, self.store, b.id, code, message)
        await self.astore.call(L.finalize, self.store, b.id, status, int(self.clock()))
        log.info("batch %s %s: %d lines not run", b.id, status, closed)

    async def _finish(self, b: BatchRow) -> None:
        now = int(self.clock())
        if not await self.astore.call(
            self.store.set_status, b.id, "finalizing", now, ("in_progress", "finalizing")
        ):
            return  # cancelled meanwhile
        fresh: BatchRow | None = await self.astore.call(self.store.get_batch, None, b.id)
        b = fresh or b
        # Nothing could run (every line refused at validation): the batch failed.
        status = "failed" if b.invalid == b.total else "completed"
        done = await self.astore.call(L.finalize, self.store, b.id, status, now)
        log.info(
            "batch %s %s: %d answered, %d in the error file",
            b.id,
            status,
            done.completed,
            done.failed,
        )

    def _in_flight(self, batch_id: str) -> bool:
        return any(bid == batch_id for bid, _ in self.tasks)

    # ---- lines -------------------------------------------------------------------------
    async def _fill(self, now: float) -> None:
        limit = self.capacity()
        self.figures.concurrency_limit = limit
        room = limit - len(self.tasks)
        if room <= 0:
            return
        for c in await self.astore.call(L.claim, self.store, room, now):
            task = asyncio.create_task(self._run_line(c), name=f"batch-line-{c.batch_id}-{c.idx}")
            self.tasks[(c.batch_id, c.idx)] = task

    async def _run_line(self, c: L.Claim) -> None:
        try:
            await self._run_line_once(c)
        finally:
            self.tasks.pop((c.batch_id, c.idx), None)
            self.wake.set()

    async def _run_line_once(self, c: L.Claim) -> None:
        cfg = self.config
        left_s = c.expires_at - self.clock()
        timeout_s = max(0.001, min(cfg.line_timeout_s, left_s))
        try:
            answer: Answer | None = await self.send(c, timeout_s)
            why = ""
        except SendError as e:
            answer, why = None, str(e)
        if answer is not None and (answer.status in (429, 503)):
            pause = answer.retry_after_s or cfg.retry_backoff_s
            await self._release(c, self.clock() + min(pause, MAX_BACKOFF_S), failed_try=False)
            return
        failed = answer is None or answer.status >= 500 or answer.status == 408
        if failed and c.attempts + 1 < cfg.max_attempts:
            backoff = min(cfg.retry_backoff_s * 2**c.attempts, MAX_BACKOFF_S)
            await self._release(c, self.clock() + backoff, failed_try=True)
            return
        if answer is None:
            result = error_line(
                c.custom_id, "server_error", f"no answer after {c.attempts + 1} tries: {why}"
            )
            await self._save(c, False, result, L.Usage())
            return
        try:
            body: Any = json.loads(answer.body)
        except ValueError:
            body = answer.body.decode("utf-8", "replace")
        ok = 200 <= answer.status < 300
        usage = usage_of(body) if ok else L.Usage()
        await self._save(
            c, ok, response_line(c.custom_id, answer.status, answer.request_id, body), usage
        )

    async def _release(self, c: L.Claim, not_before: float, failed_try: bool) -> None:
        try:
            await self.astore.call(L.release, self.store, c, not_before, failed_try)
        except StorageError as e:  # left in flight: a restart runs it again
            log.error("batch line %s/%d not put back: %s", c.batch_id, c.idx, e)

    async def _save(self, c: L.Claim, ok: bool, result: str, usage: L.Usage) -> None:
        try:
            saved = await self.astore.call(L.record, self.store, c, ok, result, usage)
        except StorageError as e:
            # Kept until the store takes it again (no new line starts meanwhile).
            log.error("batch line %s/%d answered but not stored yet: %s", c.batch_id, c.idx, e)
            self.figures.storage_ok = False
            self._unsaved.append((c, ok, result, usage))
            return
        if saved:
            self._count(ok, usage)

    def _count(self, ok: bool, usage: L.Usage) -> None:
        self.figures.line_finished(time.monotonic())
        if ok:
            self.figures.tokens += usage.completion_tokens
            self.figures.prompt_tokens += usage.prompt_tokens

    async def _save_unsaved(self) -> None:
        while self._unsaved:
            c, ok, result, usage = self._unsaved[0]
            if await self.astore.call(L.record, self.store, c, ok, result, usage):
                self._count(ok, usage)
            self._unsaved.pop(0)

    async def _refresh(self, now: float) -> None:
        self._refreshed_s = time.monotonic()
        counts = await self.astore.call(L.line_counts, self.store)
        running = await self.astore.call(self.store.batches_in, ACTIVE)
        f = self.figures
        f.lines = counts
        f.batches = {}
        for b in running:
            f.batches[b.status] = f.batches.get(b.status, 0) + 1
        ends = [b.expires_at for b in running if b.status in ("validating", "in_progress")]
        f.window_left_s = min(ends) - now if ends else None
