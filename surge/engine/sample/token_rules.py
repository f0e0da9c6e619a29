"""A request's `bad_words` as token sequences (vLLM's semantics). The rules on single tokens
themselves (logit_bias, allowed_token_ids, bad_words) are logits processors
(surge/engine/sample/logits_processors.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from surge.engine.sample.sampling_row import BadWords

if TYPE_CHECKING:
    from surge.models.formats.tokenizer import Tokenizer

__all__ = ["BadWords", "encode_bad_words"]


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
