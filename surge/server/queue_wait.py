"""Deadline-aware admission: how long an arriving request would wait for its first token.

The tokens ahead of it, in engine steps, each priced by its shape with the engine's step-cost
model (engine/client/step_cost.py: seconds = a + b * tokens + c * rows, measured at start and
refitted on every step since). Counting steps of a known shape, rather than dividing by a token
rate or multiplying by a mean step time, keeps the estimate right as the batch grows: per token a
step of 64 sequences costs far less than a step of 2, but per step far more.

- Prefill: the prompts ahead of it (its own is not counted), at the step's token budget
  (max_num_batched_tokens) less the running decodes that share each step; each such step
  costs a full budget's tokens over the running rows.
- Decodes: when the batch has no free slot for it, each slot it waits for frees when a sequence
  ends: one sequence's expected decode (the mean of the limits in flight, or of the lengths
  recently generated when shorter) spread over the batch's slots, in steps of a full batch.

"Ahead" follows the engine's policy: every admitted request without a first token (fcfs); those
of the same or a more urgent priority (priority; aging ignored); under fair share, all of its own
tenant's and as many of each other tenant's as its own tenant has (round robin between tenants).
The batch's slots are max_num_seqs, or fewer when the KV pool holds fewer of the mean sequence.

Until a step cost is known (an engine that skipped its start-up measurement, before it has
stepped a few times) only the count caps apply.
The server exports each estimate against the wait it observed (surge:queue_wait_* metrics).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

StepCost = Callable[[int, int], float]  # (tokens, rows) -> seconds for one engine step


@dataclass(frozen=True, slots=True)
class EngineShape:
    """What admission knows of the engine's batch: set once the engine is up."""

    max_num_seqs: int = 256
    max_batched_tokens: int = 512  # one step's token budget
    kv_tokens: int | None = None  # the KV pool in tokens (blocks x block size); None: unbounded
    policy: str = "fcfs"  # the engine's scheduling policy (engine/core/policies.py)


@dataclass(frozen=True, slots=True)
class Work:
    """One request as admission sees it."""

    prompt_tokens: int
    seqs: int = 1  # sequences it runs: n x prompts
    decode_limit: int = 0  # the most tokens each sequence may generate
    priority: int = 0
    tenant: str = ""


class Backlog:
    """Running sums over the admitted requests (O(1) per change, O(groups) per estimate)."""

    def __init__(self, length_alpha: float = 0.05) -> None:
        # (priority, tenant) -> [sequences, prompt tokens] of requests without a first token.
        self._pending: dict[tuple[int, str], list[int]] = {}
        self.running_seqs = 0
        self._seqs = 0  # in flight, pending or running
        self._limits = 0  # decode limits of the sequences in flight
        self._prompts = 0  # prompt tokens per sequence, summed over sequences in flight
        self.mean_length: float | None = None  # recent generated tokens per sequence
        self._alpha = length_alpha

    def add(self, w: Work) -> None:
        group = self._pending.setdefault((w.priority, w.tenant), [0, 0])
        group[0] += w.seqs
        group[1] += w.prompt_tokens
        self._seqs += w.seqs
        self._limits += w.decode_limit * w.seqs
        self._prompts += w.prompt_tokens

    def start(self, w: Work) -> None:
        """The request's first token arrived: from the queue to the batch."""
        key = (w.priority, w.tenant)
        group = self._pending[key]
        group[0] -= w.seqs
        group[1] -= w.prompt_tokens
        if group[0] <= 0:
            del self._pending[key]
        self.running_seqs += w.seqs

    def release(self, w: Work, started: bool) -> None:
        if started:
            self.running_seqs -= w.seqs
        else:
            key = (w.priority, w.tenant)
            group = self._pending[key]
            group[0] -= w.seqs
            group[1] -= w.prompt_tokens
            if group[0] <= 0:
                del self._pending[key]
        self._seqs -= w.seqs
        self._limits -= w.decode_limit * w.seqs
        self._prompts -= w.prompt_tokens

    def observe_length(self, tokens_per_seq: float) -> None:
        """A finished request's generated tokens per sequence."""
        m = self.mean_length
        self.mean_length = tokens_per_seq if m is None else m + self._alpha * (tokens_per_seq - m)

    def ahead(self, w: Work, policy: str) -> tuple[int, int]:
        """(sequences, prompt tokens) queued ahead of `w`."""
        by_band = policy in ("priority", "priority-fair")
        groups = [
            (tenant, seqs, tokens)
            for (priority, tenant), (seqs, tokens) in self._pending.items()
            if not by_band or priority <= w.priority
        ]
        if policy not in ("fair", "priority-fair"):
            return sum(g[1] for g in groups), sum(g[2] for g in groups)
        by_tenant: dict[str, list[int]] = {}
        for tenant, seqs, tokens in groups:
            t = by_tenant.setdefault(tenant, [0, 0])
            t[0] += seqs
            t[1] += tokens
        own = by_tenant.get(w.tenant, [0, 0])[0] + w.seqs
        seqs_ahead = tokens_ahead = 0
        for tenant, (seqs, tokens) in by_tenant.items():
            take = seqs if tenant == w.tenant else min(seqs, own)
            seqs_ahead += take
            tokens_ahead += tokens * take // seqs
        return seqs_ahead, tokens_ahead

    def estimate_s(self, w: Work, shape: EngineShape, step_cost: StepCost | None) -> float | None:
        """Seconds until `w` is scheduled (its own prefill, a step or so, is not counted: a
        lone request is never refused); None while no step cost is known."""
        if step_cost is None:
            return None
        seqs = self._seqs + w.seqs
        limit_mean = (self._limits + w.decode_limit * w.seqs) / seqs
        length = limit_mean if self.mean_length is None else min(limit_mean, self.mean_length)
        slots = shape.max_num_seqs
        if shape.kv_tokens is not None:
            per_seq = (self._prompts + w.prompt_tokens) / seqs + length
            slots = min(slots, max(1, int(shape.kv_tokens // max(per_seq, 1.0))))
        seqs_ahead, prompts_ahead = self.ahead(w, shape.policy)
        slots_waited = max(0, seqs_ahead + 1 - max(0, slots - self.running_seqs))
        running = min(self.running_seqs, slots)
        budget = max(1, shape.max_batched_tokens - running)
        prefill_steps = math.ceil(prompts_ahead / budget)
        decode_steps = slots_waited * length / slots
        prefill_s = step_cost(shape.max_batched_tokens, running + 1) if prefill_steps else 0.0
        decode_s = step_cost(slots, slots) if decode_steps else 0.0
        return prefill_steps * prefill_s + decode_steps * decode_s
