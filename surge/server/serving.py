"""The request flow shared by completions and chat: admit, run, then answer as JSON or as SSE.

Timeouts abort the engine request and answer 504 (or end the stream with an error event). A
client that disconnects aborts its request at once, streaming or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request
from opentelemetry.context import Context
from starlette.responses import StreamingResponse

from surge.batch.config import BATCH_LINE_HEADER, BATCH_PRIORITY
from surge.engine.client.client import EngineDeadError, EngineRequestError, RequestAbortedError
from surge.engine.client.output_processor import SequenceDelta
from surge.engine.client.outputs import TokenLogprob
from surge.http.disconnect import done_before_disconnect
from surge.observability import tracing
from surge.sampling_params import SamplingParams
from surge.server.admission import Admission
from surge.server.errors import (
    BadRequestError,
    RateLimitError,
    RequestTimeoutError,
    ServiceUnavailableError,
    SurgeHTTPError,
)
from surge.server.generation import Event, RequestTiming, choice_index, generate_merged
from surge.server.protocol import sampling_error
from surge.server.protocol_responses import SSE_DONE, UsageInfo
from surge.server.queue_wait import Work
from surge.server.request_span import record_request_span
from surge.server.state import ServerState
from surge.server.tenancy import resolve_priority, resolve_tenant

log = logging.getLogger(__name__)


class QueueWaitExceeded(Exception):
    """An admitted request had no first token within the queue-wait bound: it is shed."""

    def __init__(self, bound_s: float) -> None:
        super().__init__(bound_s)
        self.bound_s = bound_s


@dataclass(slots=True)
class Choice:
    """Everything one choice produced, accumulated over the stream."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[int, float, tuple[tuple[int, float], ...]]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_logprobs: list[TokenLogprob] | None = None  # prompt tokens 1.., when asked for


@dataclass(slots=True)
class Job:
    """One admitted API request on its way through the engine."""

    state: ServerState
    req_id: str
    prompts: list[list[int]]
    params: SamplingParams
    ticket: Admission
    key: str
    timing: RequestTiming
    tenant: str = ""
    priority: int = 0
    cache_salt: str | None = None
    choices: list[Choice] = field(default_factory=list)
    finish_reason: str = "abort"
    operation: str = "text_completion"  # OpenTelemetry's gen_ai.operation.name: or "chat"
    trace_context: Context | None = None  # the caller's trace (traceparent), when tracing
    error: str | None = None  # why it failed (timeout, engine error), for its span
    timeout_s: float | None = None  # the server's, or the shorter one the request asked for
    lora_name: str | None = None  # the LoRA adapter the request's `model` names
    # The longest wait for a first token (--max-queue-wait or the request's timeout): past it
    # the request is shed with a 429, so that none admitted waits longer. None: no bound.
    max_queue_wait_s: float | None = None
    batch_line: bool = False  # a Batch API line (surge/batch): lowest priority, own pool

    def events(self) -> AsyncIterator[Event]:
        events = generate_merged(
            self.state.client,
            self.req_id,
            self.prompts,
            self.params,
            self.timing,
            priority=self.priority,
            tenant=self.tenant,
            cache_salt=self.cache_salt,
            lora_name=self.lora_name,
        )
        return events if self.max_queue_wait_s is None else self._first_token_bounded(events)

    async def _first_token_bounded(self, events: AsyncIterator[Event]) -> AsyncIterator[Event]:
        """`events`, shed with QueueWaitExceeded when the first one comes too late."""
        assert self.max_queue_wait_s is not None
        try:
            left = self.max_queue_wait_s - (time.monotonic() - self.timing.arrival_s)
            try:
                async with asyncio.timeout(max(0.0, left)):
                    first = await anext(events)
            except TimeoutError:
                raise QueueWaitExceeded(self.max_queue_wait_s) from None
            except StopAsyncIteration:
                return
            yield first
            async for ev in events:
                yield ev
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    def apply(self, ev: Event) -> list[tuple[int, SequenceDelta]]:
        """Fold one event into the choices; return (choice index, delta) pairs."""
        if not self.ticket.released:
            self.ticket.mark_started()  # generating: no longer counts against the queue bound
        out = []
        for d in ev.delta.deltas:
            i = choice_index(ev.prompt_index, d, self.params.n)
            c = self.choices[i]
            c.text += d.text
            c.token_ids.extend(d.token_ids)
            if d.logprobs is not None:
                c.logprobs.extend(delta_triples(d))
            if d.finish_reason is not None:
                c.finish_reason = d.finish_reason
            if d.prompt_logprobs is not None:
                c.prompt_logprobs = d.prompt_logprobs
            out.append((i, d))
        return out

    def remaining_s(self) -> float | None:
        """The timeout left, counted from the request's arrival (None: none)."""
        if self.timeout_s is None:
            return None
        return max(0.0, self.timeout_s - (time.monotonic() - self.timing.arrival_s))

    def usage(self) -> UsageInfo:
        return UsageInfo.of(
            self.num_prompt_tokens, self.num_completion_tokens, self.timing.num_cached_tokens
        )

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_completion_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)

    def finish(self) -> None:
        """Release the admission slot, refund unused rate-limit tokens, record metrics."""
        if self.ticket.released:
            return
        self.ticket.release()
        st = self.state
        now = time.monotonic()
        reserve = (self.params.max_tokens or 0) * len(self.choices)
        st.limiter.refund(self.key, max(0, reserve - self.num_completion_tokens), now)
        reasons = [c.finish_reason for c in self.choices if c.finish_reason]
        if reasons and all(r != "abort" for r in reasons):
            self.finish_reason = "length" if "length" in reasons else "stop"
        if self.batch_line:  # kept out of the interactive figures (latency, lengths, waits)
            record_request_span(self, now)
            return
        t = self.timing
        if t.first_token_s is not None and self.choices:
            st.admission.backlog.observe_length(self.num_completion_tokens / len(self.choices))
            if st.queue_wait is not None and self.ticket.estimate_s is not None:
                st.queue_wait.observe_wait(self.ticket.estimate_s, t.first_token_s - t.arrival_s)
        if t.queued_s is not None:
            st.metrics.observe_overhead(t.queued_s - t.arrival_s)
        st.metrics.observe_request(
            finish_reason=self.finish_reason,
            ttft_s=None if t.first_token_s is None else t.first_token_s - t.arrival_s,
            e2e_s=now - t.arrival_s,
            queue_s=t.queue_s,
            itl_s=t.itl_s,
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=self.num_completion_tokens,
            max_tokens=self.params.max_tokens,
            n=self.params.n,
            tenant=self.tenant,
            priority=self.priority,
        )
        record_request_span(self, now)


def start_job(
    state: ServerState,
    request: Request,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    request_id: str | None,
    user: str | None,
    priority: int | None,
    cache_salt: str | None,
    operation: str = "text_completion",
    lora_name: str | None = None,
) -> Job:
    """Admit (or raise 429/503) and describe the job; nothing runs until it is consumed.

    `priority`: the body's, or None when it has none (the header then decides).
    """
    from surge.server.state import client_key, request_timeout_s

    timeout_s = request_timeout_s(request, state.config)  # a bad header: 400 before admission
    try:
        params.check_vocab(state.client.info.vocab_size)
    except ValueError as e:
        raise sampling_error(str(e)) from None
    if state.client.dead_reason is not None:
        raise ServiceUnavailableError("engine is not running", retry_after_s=5, code="engine_dead")
    tenant = resolve_tenant(request, user, state.config)
    # A batch line goes last (BATCH_PRIORITY, preempted by any interactive request under the
    # priority policies) and is admitted in a pool of its own, outside the interactive
    # request bounds and wait estimate, with no queue-wait shedding: it waits. The key's rate
    # limits cover it as they cover the key's other work (so the header bypasses none).
    batch_line = BATCH_LINE_HEADER in request.headers
    priority = BATCH_PRIORITY if batch_line else resolve_priority(request, priority, state.config)
    # Rate limits per tenant where one is named, else per API key or client address.
    key = f"tenant:{tenant}" if tenant else client_key(request)
    reserve = (params.max_tokens or 0) * params.n * len(prompts)
    num_prompt_tokens = sum(len(p) for p in prompts)
    longest = max((len(p) for p in prompts), default=0)
    work = Work(
        prompt_tokens=num_prompt_tokens,
        seqs=params.n * len(prompts),
        decode_limit=params.max_tokens or max(1, state.max_model_len - longest),
        priority=priority,
        tenant=tenant,
    )
    bounds = [b for b in (state.config.queue_wait_bound_s, timeout_s) if b is not None]
    arrival_s = getattr(request.state, "arrival_s", time.monotonic())
    if batch_line:
        state.check_rate(key, num_prompt_tokens + reserve)
        ticket = state.batch_admission.admit(num_prompt_tokens, tenant=tenant, work=work)
    else:
        ticket = state.admit(
            key,
            num_prompt_tokens,
            reserve,
            tenant=tenant,
            work=work,
            max_wait_s=min(bounds, default=None),
            arrival_s=arrival_s,
        )
    shed_after = _shed_after(state.config.queue_wait_bound_s, timeout_s)
    # The body's request_id, else the X-Request-Id header's (or the one made for it).
    rid = request_id or getattr(request.state, "request_id", None) or uuid.uuid4().hex
    job = Job(
        state=state,
        req_id=f"{rid}-{uuid.uuid4().hex[:8]}",  # unique even if a client reuses its id
        prompts=prompts,
        params=params,
        ticket=ticket,
        key=key,
        timing=RequestTiming(arrival_s=arrival_s),
        tenant=tenant,
        priority=priority,
        cache_salt=cache_salt,
        choices=[Choice() for _ in range(len(prompts) * params.n)],
        operation=operation,
        timeout_s=timeout_s,
        lora_name=lora_name,
        max_queue_wait_s=None if batch_line else shed_after,
        batch_line=batch_line,
        trace_context=tracing.extract(request.headers) if state.tracing.enabled else None,
    )
    return job


def _shed_after(bound_s: float | None, timeout_s: float | None) -> float | None:
    """When to shed a request with no first token: at the queue-wait bound, unless its timeout
    comes first or at the same time (then it times out, a 504, as it always has)."""
    if bound_s is None or (timeout_s is not None and timeout_s <= bound_s):
        return None
    return bound_s


class StreamedTokenIds:
    """return_token_ids in a stream: each choice's new token ids wait for the next chunk of
    that choice to take them (a token may add no text yet, and so send no chunk of its own)."""

    def __init__(self, num_choices: int) -> None:
        self._pending: list[list[int]] = [[] for _ in range(num_choices)]

    def add(self, i: int, token_ids: list[int]) -> None:
        self._pending[i] += token_ids

    def take(self, i: int) -> list[int] | None:
        ids, self._pending[i] = self._pending[i], []
        return ids or None


def delta_triples(d: SequenceDelta) -> list[tuple[int, float, tuple[tuple[int, float], ...]]]:
    """(token, logprob, top alternatives) for each token of a delta that carries logprobs."""
    assert d.logprobs is not None
    return [(t, lp.logprob, lp.top) for t, lp in zip(d.token_ids, d.logprobs, strict=True)]


def _map_engine_error(exc: BaseException) -> SurgeHTTPError:
    if isinstance(exc, SurgeHTTPError):
        return exc
    if isinstance(exc, QueueWaitExceeded):
        return RateLimitError(
            f"server overloaded: no first token within {exc.bound_s:g}s (--max-queue-wait, or "
            "the request's own timeout); the request was dropped, retry later",
            retry_after_s=exc.bound_s,
            code="queue_wait_exceeded",
        )
    if isinstance(exc, EngineRequestError):
        return BadRequestError(str(exc))
    if isinstance(exc, EngineDeadError):
        return ServiceUnavailableError(f"engine failed: {exc}", retry_after_s=5, code="engine_dead")
    if isinstance(exc, (TimeoutError, RequestAbortedError)):
        return RequestTimeoutError("request timed out and was aborted", code="timeout")
    return ServiceUnavailableError(f"request failed: {exc}", retry_after_s=1)


def _observe_abort(job: Job, exc: BaseException) -> None:
    if isinstance(exc, TimeoutError):
        job.state.metrics.observe_abort("timeout")
    elif isinstance(exc, QueueWaitExceeded):
        job.state.metrics.observe_abort("queue_wait")


async def consume(
    job: Job, observe: Callable[[list[tuple[int, SequenceDelta]]], None] | None = None
) -> None:
    """Run the job through the engine to its end (or its timeout), applying every event (and
    handing its deltas to `observe`)."""
    events = job.events()
    try:
        async with asyncio.timeout(job.remaining_s()):
            async for ev in events:
                deltas = job.apply(ev)
                if observe is not None:
                    observe(deltas)
    finally:
        await events.aclose()  # type: ignore[attr-defined]


async def run_detached(
    job: Job, observe: Callable[[list[tuple[int, SequenceDelta]]], None] | None = None
) -> None:
    """Consume the whole job with no client waiting on it (a background response); raises the
    HTTP error of a failure, CancelledError when cancelled."""
    try:
        await consume(job, observe)
    except asyncio.CancelledError:
        job.state.metrics.observe_abort("cancelled")
        raise
    except Exception as exc:
        _observe_abort(job, exc)
        err = _map_engine_error(exc)
        job.error = str(err.code or err.type)
        raise err from exc
    finally:
        job.finish()


async def run_to_completion(job: Job, request: Request) -> bool:
    """Consume the whole job (non-streaming). False if the client went away first."""
    task = asyncio.create_task(consume(job))
    try:
        if not await done_before_disconnect(task, request):
            task.cancel()  # the client is gone: abort in the engine
            with contextlib.suppress(asyncio.CancelledError):
                await task
            job.state.metrics.observe_abort("client_disconnect")
            return False
        exc = task.exception()
        if exc is not None:
            _observe_abort(job, exc)
            err = _map_engine_error(exc)
            job.error = str(err.code or err.type)
            raise err
        return True
    finally:
        job.finish()


def stream_response(
    job: Job,
    render: Callable[[list[tuple[int, SequenceDelta]]], list[str]],
    first: list[str],
    last: Callable[[], list[str]],
    done: bool = True,
) -> StreamingResponse:
    """SSE: `first` chunks, then `render(deltas)` per event, then `last()`, then [DONE] (not in
    the Responses API's streams: `done` false)."""

    async def body() -> AsyncIterator[str]:
        events = job.events()
        try:
            for chunk in first:
                yield chunk
            async with asyncio.timeout(job.remaining_s()):
                async for ev in events:
                    for chunk in render(job.apply(ev)):
                        yield chunk
            for chunk in last():
                yield chunk
        except asyncio.CancelledError:
            job.state.metrics.observe_abort("client_disconnect")
            raise
        except Exception as e:  # headers are sent: report in-band, then end the stream
            _observe_abort(job, e)
            err = _map_engine_error(e)
            job.error = str(err.code or err.type)
            yield err.sse_event()
        finally:
            await events.aclose()  # type: ignore[attr-defined]
            job.finish()
        if done:
            yield SSE_DONE

    return StreamingResponse(body(), media_type="text/event-stream")
