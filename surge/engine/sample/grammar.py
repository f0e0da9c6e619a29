"""Constrained decoding: a grammar matcher per request masks each step's logits.

llguidance computes, from a request's grammar and the text so far, the set of next tokens that
keep the text inside the grammar: a bitmask of one bit per vocabulary entry (~0.1-2 ms, in
native code with the GIL released). The sampler sets every other logit to -inf before it picks,
so greedy and random sampling alike only ever choose an allowed token; the engine then feeds the
chosen token to the matcher and ends the request as soon as the grammar is complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from surge.models.formats.tokenizer import Tokenizer
from surge.structured_output import StructuredOutput

if TYPE_CHECKING:
    import llguidance


class GrammarCompiler:
    """Matchers for one model's tokenizer; the tokenizer index is built on first use (~0.25 s)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None

    def _index(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            import llguidance as llg

            self._ll_tokenizer = llg.LLTokenizer(
                self._tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=self._eos
            )
        return self._ll_tokenizer

    def matcher(self, structured: StructuredOutput) -> llguidance.LLMatcher:
        """A fresh matcher at the grammar's start; raises ValueError for a bad grammar."""
        import llguidance as llg

        # Validated by the API process already; the matcher reports what is wrong itself.
        m = llg.LLMatcher(self._index(), structured.grammar(validate=False), log_level=0)
        if m.is_error():
            raise ValueError(f"{structured.what()} is not valid: {m.get_error()}")
        return m


def token_bitmask(matchers: Sequence[llguidance.LLMatcher], vocab: int) -> torch.Tensor:
    """[len(matchers), ceil(vocab / 32)] int32 on the CPU: bit j of word w set when token
    32 * w + j may come next."""
    words = (vocab + 31) // 32
    bits = torch.empty(len(matchers), words, dtype=torch.int32)
    for i, m in enumerate(matchers):
        m.unsafe_compute_mask_ptr(bits[i].data_ptr(), words * 4)
    return bits


def unpack_bitmask(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """The bitmask as [rows, vocab] bool: which tokens each row allows."""
    shifts = torch.arange(32, dtype=torch.int32, device=bits.device)
    unpacked = (bits.unsqueeze(-1) >> shifts) & 1  # [rows, words, 32]
    return unpacked.view(bits.shape[0], -1)[:, :vocab].bool()


def apply_token_bitmask_(
    logits: torch.Tensor, rows: Sequence[int], bits: torch.Tensor, use_kernel: bool = True
) -> None:
    """Set to -inf, in place, every logit of `rows` that its row of `bits` forbids."""
    if use_kernel and logits.device.type == "cpu" and logits.is_contiguous():
        from surge.models.kernels import load_token_mask

        if load_token_mask() is not None:
            index = torch.tensor(rows, dtype=torch.int64)
            torch.ops.surge.apply_token_bitmask_(logits, bits, index)
            return
    idx = torch.tensor(rows, device=logits.device)
    allowed = unpack_bitmask(bits.to(logits.device), logits.shape[1])
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
