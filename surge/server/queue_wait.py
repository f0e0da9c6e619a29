"""Deadline-aware admission: how long an arriving request would wait for its first token.

The work ahead of it, in tokens, over the engine's measured throughput (tokens per busy second,
engine/throughput.py):

- the prompts still to prefill ahead of it, and its own;
- when the batch has no free slot for it, the decodes that must finish first: each slot it
  waits for costs one sequence's expected decode (the mean of the limits in flight, or of the
  lengths recently generated when that is shorter), since a slot frees when a sequence ends.

"Ahead" follows the engine's policy: every admitted request without a first token (fcfs); those
of the same or a more urgent priority (priority; aging ignored); under fair share, all of its own
tenant's and as many of each other tenant's as its own tenant has (round robin between tenants).
The batch's slots are max_num_seqs, or fewer when the KV pool holds fewer of the mean sequence.

The estimate is deliberately on the pessimistic side (prompts cost as much as decodes, a prefix
cache hit is not counted), so that an admitted request starts within the bound; the server
exports the estimate against the wait it observed (surge:queue_wait_* metrics).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineShape:
    """What admission knows of the engine's batch: set once the engine is up."""

    max_num_seqs: int = 256
    kv_tokens: int | None = None  # the KV pool in tokens (blocks x block size); None: unbounded
    policy: str = "fcfs"  # the engine's scheduling policy (engine/policies.py)


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

    def estimate_s(self, w: Work, shape: EngineShape, tokens_per_s: float | None) -> float | None:
        """Seconds until `w`'s first token; None when it must queue for a slot and the engine's
        throughput is not measured yet (0.0 when a slot is free and nothing is measured)."""
        seqs = self._seqs + w.seqs
        limit_mean = (self._limits + w.decode_limit * w.seqs) / seqs
        length = limit_mean if self.mean_length is None else min(limit_mean, self.mean_length)
        slots = shape.max_num_seqs
        if shape.kv_tokens is not None:
            per_seq = (self._prompts + w.prompt_tokens) / seqs + length
            slots = min(slots, max(1, int(shape.kv_tokens // max(per_seq, 1.0))))
        seqs_ahead, prompts_ahead = self.ahead(w, shape.policy)
        slots_waited = max(0, seqs_ahead + 1 - max(0, slots - self.running_seqs))
        if tokens_per_s is None:
            return 0.0 if slots_waited == 0 else None
        return (prompts_ahead + w.prompt_tokens + slots_waited * length) / tokens_per_s
