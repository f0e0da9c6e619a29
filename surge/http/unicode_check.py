"""Lone UTF-16 surrogates in JSON strings: valid JSON ("\\ud800"), but no character, and no UTF-8
for it, so a tokenizer (or the UTF-8 of an answer that echoes it) fails on it later. The server
refuses such a body with a 400 before any route reads it; the gateway does not parse one for
routing (the upstream says what is wrong)."""

from __future__ import annotations

import json
import re
from typing import Any

# A \uXXXX escape of a UTF-16 surrogate (JSON writes characters past U+FFFF as two of them).
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def lone_surrogate(value: Any) -> bool:
    """Whether a parsed JSON value holds a string with a lone surrogate (a pair's half without
    the other)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(lone_surrogate(k) or lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(lone_surrogate(v) for v in value)
    return False


def body_has_lone_surrogate(body: bytes, parsed: Any = None) -> bool:
    """Whether a JSON body (or `parsed`, its value, when at hand) holds one; one scan of the
    bytes in the usual case, where no surrogate escape appears at all."""
    if not SURROGATE_ESCAPE.search(body):
        return False
    if parsed is None:
        try:
            parsed = json.loads(body)
        except ValueError:
            return False  # not JSON: whoever reads it says so
    return lone_surrogate(parsed)
