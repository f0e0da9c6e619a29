"""A request inside the engine: its tokens, progress through the KV cache, and lifecycle."""

from __future__ import annotations

import enum
from typing import Any

from surge.engine.client.outputs import FinishReason, TokenLogprob
from surge.engine.core.block_hash import extend_block_hashes
from surge.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """Mutable engine state of one sequence; the scheduler is its only writer.

    NOTE: num_computed_tokens counts tokens whose K/V are in the cache. Prefill and decode are the
    same thing: each step computes some of the tokens in [num_computed_tokens, num_tokens).
    """

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_s: float,
        seed: int,
        max_tokens: int,
        block_size: int,
        *,
        priority: int = 0,
        tenant: str = "",
        cache_salt: bytes = b"",
        share_prompt_with: str | None = None,
        grammar: Any = None,
        lora_slot: int = -1,
        bad_words: tuple[tuple[int, ...], ...] = (),
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("prompt must contain at least one token")
        self.req_id = req_id
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.arrival_s = arrival_s
        self.seed = seed
        self.max_tokens = max_tokens  # resolved against the context length
        self.priority = priority
        self.tenant = tenant
        self.cache_salt = cache_salt
        self.share_prompt_with = share_prompt_with  # a sibling (n > 1) whose prompt KV we reuse
        self.grammar = grammar  # an llguidance matcher (structured output), fed every token
        self.lora_slot = lora_slot  # the LoRA adapter's slot (-1: none); its salt is in cache_salt
        self.bad_words = bad_words  # params.bad_words as token sequences
        self.draft: list[int] = []  # speculative tokens to verify at the next decode
        self.ngram: Any = None  # its NgramIndex, made at the first proposal
        self.num_new_tokens = 0  # tokens appended by the last step (several when drafts hit)
        self.block_size = block_size
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        # params.prompt_logprobs: those of prompt tokens 1.. (token 0 has none), as computed
        self.prompt_logprobs: list[TokenLogprob] = []
        self.block_hashes: list[bytes] = []
        extend_block_hashes(self.block_hashes, self.all_token_ids, block_size, cache_salt)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit at first admission; -1 until admitted
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.seq_no = 0  # arrival order, set by the scheduler: breaks ties between equal keys
        self.finish_reason: FinishReason | None = None
        self.first_scheduled_s: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for and not all computed: its prompt must run, not be cached."""
        return (
            self.params.prompt_logprobs is not None
            and len(self.prompt_logprobs) < self.num_prompt_tokens - 1
        )

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def append_token(self, token_id: int, logprob: TokenLogprob | None) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if logprob is not None:
            self.logprobs.append(logprob)
        extend_block_hashes(self.block_hashes, self.all_token_ids, self.block_size, self.cache_salt)

    def stop_reason(self, eos_token_ids: tuple[int, ...]) -> FinishReason | None:
        """Token-level stop after the last appended token (stop strings are checked on text)."""
        last = self.output_token_ids[-1]
        params = self.params
        if self.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and last in eos_token_ids:
                return FinishReason.STOP
            if last in params.stop_token_ids:
                return FinishReason.STOP
        if self.num_output_tokens >= self.max_tokens:
            return FinishReason.LENGTH
        return None
