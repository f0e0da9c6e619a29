"""The engine's statistics, each part owned by what counts it, composed into EngineStats.

Each counter object lives on its owner (the scheduler's SchedulerStats and SpecStats, the block
manager's PrefixCacheStats, the core's StepStats): only the owner adds to it. `take()` hands out
a copy to send to the API process (and drains what is per interval: the step samples);
`reset()` zeroes it (after the start-up calibration). Plain data, no torch: the API process
reads these.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Self


class _Counters:
    """take() and reset() for a dataclass of counters that all start at their defaults."""

    def take(self) -> Self:
        return copy.copy(self)  # flat counters; a part holding a container copies it itself

    def reset(self) -> None:
        fresh = type(self)()
        for f in fields(self):  # type: ignore[arg-type]
            setattr(self, f.name, getattr(fresh, f.name))


@dataclass(slots=True)
class SchedulerStats(_Counters):
    """Counted by the scheduler, since start."""

    num_preemptions: int = 0
    num_blocked_on_kv: int = 0  # admissions stopped for want of KV blocks
    tenant_tokens: dict[str, int] = field(default_factory=dict)  # tokens scheduled per tenant

    def take(self) -> SchedulerStats:
        taken = copy.copy(self)
        taken.tenant_tokens = dict(self.tenant_tokens)  # the scheduler goes on adding to its own
        return taken


@dataclass(slots=True)
class SpecStats(_Counters):
    """Speculative decoding, counted by the scheduler as it verifies drafts, since start."""

    num_drafts: int = 0  # steps with a draft
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(slots=True)
class PrefixCacheStats(_Counters):
    """Counted by the block manager when a request is first given blocks, since start."""

    queries: int = 0  # tokens looked up
    hits: int = 0  # tokens found cached


@dataclass(slots=True)
class StepStats(_Counters):
    """Counted by the engine core's step loop, since start; `samples` since the last take()."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_steps: int = 0
    step_tokens: int = 0  # tokens scheduled over all steps
    prefill_tokens: int = 0  # of which prefill chunks
    step_time_s: float = 0.0  # seconds in step()
    wait_time_s: float = 0.0  # seconds blocked waiting for work (the process loop adds these)
    # (tokens, rows, seconds) per step: what a step of that shape costs (admission's model).
    samples: list[tuple[int, int, float]] = field(default_factory=list)

    def take(self) -> StepStats:
        taken = copy.copy(self)
        self.samples = []
        return taken


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What the engine reports with every batch of outputs: gauges of now, and the counters."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_blocks: int = 0
    block_size: int = 0
    prefix_cache_blocks: int = 0  # blocks the prefix cache holds now
    # LoRA adapters of running / waiting requests (vLLM's lora_requests_info), and the slots.
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()
    max_loras: int = 0
    # The limits a full step reaches (--batch-invariant may have capped the token budget).
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    scheduler: SchedulerStats = field(default_factory=SchedulerStats)
    spec: SpecStats = field(default_factory=SpecStats)
    prefix_cache: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    steps: StepStats = field(default_factory=StepStats)
    # Tokens per step since the last scrape: the API process fills it from steps.samples.
    iteration_tokens: list[int] = field(default_factory=list)
