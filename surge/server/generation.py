"""Run one API request on the engine: one engine request per prompt, streams merged, timed.

Routes turn the merged `Event`s into JSON or SSE; this module knows nothing of HTTP shapes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from surge.engine.client.client import AsyncEngineClient
from surge.engine.client.output_processor import RequestDelta, SequenceDelta
from surge.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class Event:
    """Deltas of one prompt (index `prompt_index`) from one engine step."""

    prompt_index: int
    delta: RequestDelta


@dataclass(slots=True)
class RequestTiming:
    arrival_s: float
    first_token_s: float | None = None
    last_token_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    queue_s: float = 0.0
    queued_s: float | None = None  # when the engine request was sent
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0

    def on_queued(self, now_s: float) -> None:
        if self.queued_s is None:
            self.queued_s = now_s

    def on_delta(self, rd: RequestDelta, now_s: float) -> None:
        new_tokens = sum(len(d.token_ids) for d in rd.deltas)
        if new_tokens == 0:
            return
        self.num_cached_tokens = max(self.num_cached_tokens, rd.num_cached_tokens)
        if self.first_token_s is None:
            self.first_token_s = now_s
            self.queue_s = rd.queue_time_s
        elif self.last_token_s is not None:
            self.itl_s.append(now_s - self.last_token_s)
        self.last_token_s = now_s
        self.num_output_tokens += new_tokens


async def generate_merged(
    client: AsyncEngineClient,
    req_id: str,
    prompts: list[list[int]],
    params: SamplingParams,
    timing: RequestTiming,
    *,
    priority: int = 0,
    tenant: str = "",
    cache_salt: str | None = None,
    lora_name: str | None = None,
) -> AsyncIterator[Event]:
    """All prompts' deltas in arrival order. Closing the iterator aborts every engine request."""
    if len(prompts) == 1:
        gen = client.generate(
            req_id,
            prompts[0],
            params,
            priority=priority,
            tenant=tenant,
            cache_salt=cache_salt,
            arrival_s=timing.arrival_s,
            on_queued=timing.on_queued,
            lora_name=lora_name,
        )
        try:
            async for rd in gen:
                timing.on_delta(rd, time.monotonic())
                yield Event(0, rd)
        finally:
            await gen.aclose()
        return

    queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()

    async def pump(i: int, prompt: list[int]) -> None:
        try:
            async for rd in client.generate(
                f"{req_id}-{i}",
                prompt,
                params,
                priority=priority,
                tenant=tenant,
                cache_salt=cache_salt,
                arrival_s=timing.arrival_s,
                on_queued=timing.on_queued,
                lora_name=lora_name,
            ):
                await queue.put(Event(i, rd))
            await queue.put(None)
        except Exception as e:  # surfaced to the consumer, which cancels the others
            await queue.put(e)

    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prompts)]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            timing.on_delta(item.delta, time.monotonic())
            yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def choice_index(prompt_index: int, delta: SequenceDelta, n: int) -> int:
    """OpenAI numbers choices across prompts: prompt i's k-th sample is choice i * n + k."""
    return prompt_index * n + delta.index
