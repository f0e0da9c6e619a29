"""Streaming detokenization: turn generated token ids into text deltas as they arrive.

Decoding token by token is wrong (a character may span tokens, and some tokenizers render a
token differently depending on its neighbours), and decoding the whole output each step costs
O(length). We keep a small window instead: `prefix_offset..read_offset` are tokens whose text
was already emitted (kept only as context), `read_offset..` are tokens not yet emitted. Each
step decodes the window with and without the pending tokens; the difference is the new text.
"""

from __future__ import annotations

from collections.abc import Sequence

from surge.models.formats.tokenizer import Tokenizer

# Prompt tokens decoded together with the first output tokens, so those decode in context.
_PROMPT_CONTEXT = 5
# A character is at most 4 bytes; holding back this many tokens means the text is invalid
# UTF-8 that no later token can complete, so it is emitted (with U+FFFD) to bound the window.
_MAX_PENDING = 16
# Ids before the window are dropped once this many pile up, so memory stays bounded too.
_TRIM_AT = 256
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Text deltas for one request's output tokens."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        context = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        if self._decode(context).endswith(_REPLACEMENT):
            # The prompt ends mid-character: output bytes must not complete prompt text.
            context = []
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._deltas: list[str] = []
        self._text: str | None = ""

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        if self._text is None:
            self._text = "".join(self._deltas)
        return self._text

    def add(self, token_id: int) -> str:
        """Append one generated token; return the text it completes ("" while it only holds
        part of a multi-byte character)."""
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """Text still held back (an incomplete character at the end of the output)."""
        if self._read_offset == len(self._ids):
            return ""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        pending = len(self._ids) - self._read_offset
        if not final and new_text.endswith(_REPLACEMENT) and pending < _MAX_PENDING:
            return ""  # wait for the rest of the character
        # The window's first tokens decode the same with or without the pending ones.
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if self._prefix_offset >= _TRIM_AT:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        if delta:
            self._deltas.append(delta)
            self._text = None
        return delta

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)
