"""Everything that changes a row's logits before the pick, one processor each, in the order the
sampler runs them (vLLM v1's): repetition/frequency/presence penalties -> logit_bias,
allowed_token_ids, bad_words -> min_tokens -> the grammar's mask.

The contract: a processor is `active(row)` for the rows whose logits it changes, and
`apply(logits, rows, active)` changes those rows. The sampler skips its work (the greedy fast path:
argmax straight from the model's logits) only where no processor is active, so a new
logits-changing setting is a new processor in `default_processors`, never a new condition there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from surge.engine.sample.grammar import apply_token_bitmask_, token_bitmask
from surge.engine.sample.sampling_row import SamplingRow


class LogitsProcessor(Protocol):
    # apply() writes into the tensor it is given (the sampler hands it a copy when the raw
    # logits are still needed for logprobs); otherwise it leaves its input alone.
    in_place: bool
    # apply() only sets logits to -inf: exact in any float dtype, so a greedy pick needs no
    # float32 copy of the model's logits for it.
    masks_only: bool

    def active(self, row: SamplingRow) -> bool:
        """Whether apply() would change this row's logits."""
        ...

    def apply(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], active: Sequence[int]
    ) -> torch.Tensor:
        """The logits [len(rows), vocab] with the rows in `active` (those active()) changed."""
        ...


def _has_penalties(row: SamplingRow) -> bool:
    p = row.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _token_counts(
    ids_per_row: Sequence[tuple[int, Sequence[int]]], shape: torch.Size, device: torch.device
) -> torch.Tensor:
    """Occurrences of each token in each listed row: [num_rows, vocab] float32, 0 elsewhere."""
    num_rows, vocab = shape
    flat: list[int] = []
    for row, ids in ids_per_row:
        base = row * vocab
        flat.extend(base + t for t in ids)
    counts = torch.zeros(num_rows * vocab, dtype=torch.float32, device=device)
    if flat:
        index = torch.tensor(flat, dtype=torch.long, device=device)
        counts.scatter_add_(0, index, torch.ones(len(flat), dtype=torch.float32, device=device))
    return counts.view(num_rows, vocab)


def column(values: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).unsqueeze(1)  # [num_rows, 1]


def apply_penalties(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Repetition, then frequency/presence penalties. Never modifies `logits`; float32 result.

    Repetition (prompt + output tokens): positive logits are divided by the penalty, negative ones
    multiplied. Frequency/presence (output tokens only): logit -= freq * count + presence * seen.
    """
    out = logits.float()  # [num_rows, vocab]
    if not any(_has_penalties(r) for r in rows):
        return out
    device = out.device
    rep_rows = [
        (i, [*r.prompt_token_ids, *r.output_token_ids])
        for i, r in enumerate(rows)
        if r.params.repetition_penalty != 1.0
    ]
    if rep_rows:
        seen = _token_counts(rep_rows, out.shape, device) > 0  # [num_rows, vocab]
        rep = column([r.params.repetition_penalty for r in rows], device)
        out = torch.where(seen, torch.where(out > 0, out / rep, out * rep), out)
    freq_rows = [
        (i, r.output_token_ids)
        for i, r in enumerate(rows)
        if r.params.presence_penalty != 0.0 or r.params.frequency_penalty != 0.0
    ]
    if freq_rows:
        counts = _token_counts(freq_rows, out.shape, device)  # [num_rows, vocab]
        freq = column([r.params.frequency_penalty for r in rows], device)
        presence = column([r.params.presence_penalty for r in rows], device)
        out = out - freq * counts - presence * (counts > 0).float()
    return out


def _min_tokens_active(row: SamplingRow) -> bool:
    return len(row.output_token_ids) < row.params.min_tokens


def apply_min_tokens(
    logits: torch.Tensor, rows: Sequence[SamplingRow], eos_token_ids: Sequence[int]
) -> torch.Tensor:
    """Forbid EOS (unless ignore_eos) and stop_token_ids until a row has min_tokens outputs."""
    vocab = logits.shape[1]
    row_idx: list[int] = []
    col_idx: list[int] = []
    for i, r in enumerate(rows):
        if not _min_tokens_active(r):
            continue
        banned = set(r.params.stop_token_ids)
        if not r.params.ignore_eos:
            banned.update(eos_token_ids)
        # User-supplied ids may lie outside this model's vocabulary: nothing to mask there.
        cols = sorted(t for t in banned if 0 <= t < vocab)
        row_idx.extend([i] * len(cols))
        col_idx.extend(cols)
    if not row_idx:
        return logits
    device = logits.device
    index = (torch.tensor(row_idx, device=device), torch.tensor(col_idx, device=device))
    return logits.index_put(index, torch.tensor(float("-inf"), dtype=logits.dtype, device=device))


class Penalties:
    """repetition_penalty (prompt + output tokens), frequency and presence (output tokens)."""

    in_place = False
    masks_only = False

    def active(self, row: SamplingRow) -> bool:
        return _has_penalties(row)

    def apply(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], active: Sequence[int]
    ) -> torch.Tensor:
        return apply_penalties(logits, rows)


class TokenRules:
    """A request's rules on single tokens: OpenAI's logit_bias (added; ids past the vocabulary
    ignored), then vLLM's allowed_token_ids (every other token masked) and bad_words (a word's
    last token masked where the tokens before it were just written). One processor, not three:
    the sampler checks every processor on every row at every step, and these are rare."""

    in_place = False
    masks_only = False  # logit_bias adds

    def active(self, row: SamplingRow) -> bool:
        p = row.params
        return bool(p.logit_bias or row.bad_words) or p.allowed_token_ids is not None

    def apply(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], active: Sequence[int]
    ) -> torch.Tensor:
        vocab, device = logits.shape[1], logits.device
        bias_r: list[int] = []
        bias_c: list[int] = []
        bias_v: list[float] = []
        ban_r: list[int] = []
        ban_c: list[int] = []
        allowed: list[tuple[int, tuple[int, ...]]] = []
        for i in active:
            row = rows[i]
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


class MinTokens:
    """min_tokens: EOS (unless ignore_eos) and stop_token_ids masked until that many outputs."""

    in_place = False
    masks_only = True

    def __init__(self, eos_token_ids: Sequence[int]) -> None:
        self.eos_token_ids = tuple(eos_token_ids)

    def active(self, row: SamplingRow) -> bool:
        return _min_tokens_active(row)

    def apply(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], active: Sequence[int]
    ) -> torch.Tensor:
        return apply_min_tokens(logits, rows, self.eos_token_ids)


class GrammarMask:
    """Structured output: every token the row's grammar matcher forbids masked, in place."""

    in_place = True
    masks_only = True

    def __init__(self, use_kernels: bool = True) -> None:
        self.use_kernels = use_kernels  # the compiled logit mask

    def active(self, row: SamplingRow) -> bool:
        return row.grammar is not None

    def apply(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], active: Sequence[int]
    ) -> torch.Tensor:
        bits = token_bitmask([rows[i].grammar for i in active], logits.shape[1])
        apply_token_bitmask_(logits, list(active), bits, self.use_kernels)
        return logits


def default_processors(
    eos_token_ids: Sequence[int], use_kernels: bool = True
) -> list[LogitsProcessor]:
    """Every processor the engine runs, in order."""
    return [
        Penalties(),
        TokenRules(),
        MinTokens(eos_token_ids),
        GrammarMask(use_kernels),
    ]
