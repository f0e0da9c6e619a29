"""What crosses the engine-core boundary: requests in, per-step token outputs and stats out."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from surge.sampling_params import SamplingParams


class FinishReason(enum.StrEnum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"  # client gone, timeout, or an explicit abort


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token_id, logprob), best first
    rank: int = 0  # of the token in its distribution, 1 = the likeliest (0: not computed)


@dataclass(frozen=True, slots=True)
class EngineCoreRequest:
    """One sequence to generate (n > 1 arrives as n of these, fanned out by the front end)."""

    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_s: float | None = None  # time.monotonic() at arrival; None = now
    seed: int | None = None  # effective seed; None = params.seed or a random one
    priority: int = 0
    tenant: str = ""
    cache_salt: str | None = None
    share_prompt_with: str | None = None  # sibling req_id whose prompt KV blocks can be shared
    lora_name: str | None = None  # a loaded LoRA adapter; None: the base model


@dataclass(frozen=True, slots=True)
class EngineCoreOutput:
    """New tokens of one request from one step; finish_reason set on its last output."""

    req_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprob] | None
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    queue_time_s: float = 0.0  # arrival to first scheduled
    # With the first tokens, when params.prompt_logprobs: prompt tokens 1.. (token 0 has none)
    prompt_logprobs: list[TokenLogprob] | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_blocks: int = 0
    block_size: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_blocks: int = 0  # blocks the prefix cache holds now (a gauge)
    num_preemptions: int = 0
    prompt_tokens: int = 0  # counters since start
    generation_tokens: int = 0
    num_steps: int = 0
    # Tokens per step since the last scrape: the API process fills it from step_samples.
    iteration_tokens: list[int] = field(default_factory=list)
    # (tokens, rows, seconds) per step since last stats: what a step of that shape costs.
    step_samples: list[tuple[int, int, float]] = field(default_factory=list)
    # Tokens scheduled per tenant since start (prefill + decode): the service each tenant got.
    tenant_tokens: dict[str, int] = field(default_factory=dict)
    # LoRA adapters of running / waiting requests (vLLM's lora_requests_info), and the slots.
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()
    max_loras: int = 0
    # Speculative decoding, counters since start: steps with a draft, draft tokens, accepted.
    spec_num_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    # For the bottleneck diagnosis, counters since start: tokens scheduled over all steps and
    # those of prefill chunks; admissions that stopped for want of KV blocks; seconds in step()
    # and seconds blocked waiting for work. And the limits a full step reaches.
    step_tokens: int = 0
    prefill_tokens: int = 0
    num_blocked_on_kv: int = 0
    step_time_s: float = 0.0
    wait_time_s: float = 0.0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
