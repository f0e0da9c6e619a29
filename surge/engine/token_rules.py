"""A request's rules on single tokens, applied to its row of logits before sampling: OpenAI's
`logit_bias` (added), vLLM's `allowed_token_ids` (all others masked) and `bad_words` (the last
token of a word masked where the tokens before it were just generated)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from surge.engine.sampler import SamplingRow
    from surge.models.tokenizer import Tokenizer

BadWords = tuple[tuple[int, ...], ...]


def has_token_rules(row: SamplingRow) -> bool:
    p = row.params
    return bool(p.logit_bias or row.bad_words) or p.allowed_token_ids is not None


def encode_bad_words(words: Sequence[str], tokenizer: Tokenizer) -> BadWords:
    """Each word as the model may write it: alone, and after a space (a different first token in
    byte-level vocabularies), as vLLM does."""
    seqs: dict[tuple[int, ...], None] = {}
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tuple(tokenizer.encode(text, add_special_tokens=False))
            if ids:
                seqs[ids] = None
    return tuple(seqs)


def apply_token_rules(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Out of place (the caller's tensor may be the raw logits that logprobs report)."""
    vocab = logits.shape[1]
    device = logits.device
    bias_r: list[int] = []
    bias_c: list[int] = []
    bias_v: list[float] = []
    ban_r: list[int] = []
    ban_c: list[int] = []
    allowed: list[tuple[int, tuple[int, ...]]] = []
    for i, row in enumerate(rows):
        p = row.params
        for token, bias in p.logit_bias:
            if token < vocab:
                bias_r.append(i)
                bias_c.append(token)
                bias_v.append(bias)
        if p.allowed_token_ids is not None:
            allowed.append((i, p.allowed_token_ids))
        out = row.output_token_ids
        for seq in row.bad_words:
            *head, last = seq
            if last < vocab and (not head or list(out[len(out) - len(head) :]) == head):
                ban_r.append(i)
                ban_c.append(last)
    if bias_r:
        index = (torch.tensor(bias_r, device=device), torch.tensor(bias_c, device=device))
        values = torch.tensor(bias_v, dtype=logits.dtype, device=device)
        logits = logits.index_put(index, values, accumulate=True)
    if allowed:
        keep = torch.ones_like(logits, dtype=torch.bool)
        for i, ids in allowed:
            keep[i] = False
            keep[i, [t for t in ids if t < vocab]] = True
        logits = logits.masked_fill(~keep, float("-inf"))
    if ban_r:
        index = (torch.tensor(ban_r, device=device), torch.tensor(ban_c, device=device))
        logits = logits.index_put(index, torch.tensor(float("-inf"), device=device))
    return logits
