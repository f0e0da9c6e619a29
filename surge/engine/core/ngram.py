"""Prompt-lookup (n-gram) drafts for speculative decoding: no draft model.

The last n tokens of a sequence (n from `max_n` down to `min_n`) are looked up among its earlier
tokens; where they occurred last, the tokens that followed are the draft. Outputs that copy from
the prompt (code edits, quotes, summaries, RAG answers, structured rewrites) are drafted well.

Each sequence keeps an index from every n-gram to where it last ended, extended by the tokens
appended since the previous call, so a proposal costs O(new tokens), not a scan of the sequence.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        # n -> n-gram -> the index of its last token, for n-grams ending before the suffix
        self._last_end: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_n, max_n + 1)
        }
        self._indexed = 0  # n-grams ending at positions < this are in the index

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens to follow `tokens` (which extends what earlier calls saw), or []."""
        if k <= 0:
            return []
        length = len(tokens)
        # Index every n-gram that ends before the last token (the suffix itself is the query).
        for end in range(self._indexed, length - 1):
            for n, table in self._last_end.items():
                if end + 1 >= n:
                    table[tuple(tokens[end + 1 - n : end + 1])] = end
        self._indexed = max(self._indexed, length - 1)
        for n in range(self.max_n, self.min_n - 1, -1):
            if length < n:
                continue
            found = self._last_end[n].get(tuple(tokens[length - n :]))
            if found is not None:
                return list(tokens[found + 1 : min(found + 1 + k, length)])
        return []
