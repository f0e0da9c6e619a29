"""What crosses the engine-core boundary: requests in, per-step token outputs out (the stats
that go with them: surge/engine/stats.py)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

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
