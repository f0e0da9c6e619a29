"""What flows from the scheduler to the runner and back: frozen, plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

from surge.engine.client.outputs import TokenLogprob
from surge.engine.sample.sampling_row import SamplingRow


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    req_id: str
    token_ids: tuple[int, ...]  # the tokens computed this step: a prefill chunk or the last token
    start_pos: int  # == num_computed_tokens before this step
    block_table: tuple[int, ...]  # covers start_pos + len(token_ids) tokens
    sampling: SamplingRow | None  # set when this chunk reaches the end of the known tokens
    lora_slot: int = -1  # the LoRA adapter's slot; -1: the base model
    # Speculative decoding: draft tokens appended to token_ids (its last len(draft) entries),
    # and the sampling rows of the positions after them: the logits at token_ids[-1 - k + i]
    # are sampled with `sampling` for i = 0, with draft_sampling[i - 1] after.
    draft: tuple[int, ...] = ()
    draft_sampling: tuple[SamplingRow, ...] = ()
    # Prompt logprobs: the logits at token_ids[prompt_rows_start + i] score prompt_targets[i]
    # (the next prompt token), with prompt_top alternatives.
    prompt_rows_start: int = 0
    prompt_targets: tuple[int, ...] = ()
    prompt_top: int = 0
    batch_invariant: bool = False  # its params ask for batch-invariant numerics
    # The request's prompt length: a prompt's last token (after a prefix hit or a chunk) is
    # a prefill row, never a decode, so that it gets the prefill numerics however the prompt
    # was split. 0: unknown, every one-token step past position 0 is a decode.
    num_prompt_tokens: int = 0

    @property
    def is_decode(self) -> bool:
        return (
            len(self.token_ids) == 1
            and self.start_pos > 0
            and self.start_pos >= self.num_prompt_tokens
        )


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    requests: tuple[ScheduledRequest, ...]
    num_tokens: int
    preempted: tuple[str, ...] = ()
    # (source, destination) KV blocks to copy before the model runs: partial prefix hits.
    kv_copies: tuple[tuple[int, int], ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.requests


@dataclass(frozen=True, slots=True)
class SampledToken:
    token_id: int
    logprob: float | None
    top_logprobs: tuple[tuple[int, float], ...] | None


@dataclass(frozen=True, slots=True)
class SampledTokens:
    tokens: dict[str, SampledToken]  # req_id -> token, for the requests that sampled
    # req_id -> the tokens sampled after each draft token (speculative decoding)
    drafts: dict[str, list[SampledToken]] = field(default_factory=dict)
    # req_id -> logprobs of the prompt tokens this step scored, in order
    prompt_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)
