"""Reading one JSON tool call, `{"name": ..., "arguments": {...}}`, while it is still being written.

The name counts once its string is closed; the arguments are the raw JSON text of their value
so far, so that what a stream sends is a prefix of what the finished call holds. A call whose
keys come in another order is read whole when it ends."""

from __future__ import annotations

import json
import re

from surge.server.tool_parsers.base import PartialCall

_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ARGS_KEY = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")


def value_end(text: str, start: int) -> int | None:
    """Index just past the JSON value that begins at `start`, or None while it is unfinished.
    Strings are skipped with their escapes, so brackets inside them do not count."""
    if start >= len(text):
        return None
    first = text[start]
    if first not in '{["':
        m = _SCALAR.match(text, start)
        # A number may still be growing while it ends the text.
        return m.end() if m is not None and m.end() < len(text) else None
    depth, i, in_string = 0, start, False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def read_json_call(body: str, ended: bool) -> PartialCall:
    """The call written so far in `body`; `ended`: nothing more will come (the call's closing
    marker was seen, or the output ended), so a call that does not parse is malformed."""
    head = _NAME.match(body)
    name = _json_string(head.group(1)) if head is not None else None
    arguments, args_done = "", False
    if head is not None and (key := _ARGS_KEY.match(body, head.end())) is not None:
        start = key.end()
        end = value_end(body, start)
        if end is not None:
            arguments, args_done = _arguments_text(body[start:end]), True
        elif body[start : start + 1] == "{":
            arguments = body[start:]  # an object streams as it comes; a string waits
    if not ended:
        return PartialCall(name, arguments, done=False)
    try:
        obj = json.loads(body)
    except ValueError:
        return PartialCall(name, arguments, done=True, valid=False)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return PartialCall(name, arguments, done=True, valid=False)
    if name is None or not args_done:  # keys in another order, or no arguments at all
        raw = obj.get("arguments", obj.get("parameters", {}))
        arguments = raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False)
    return PartialCall(obj["name"], arguments, done=True)


def _json_string(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _arguments_text(value: str) -> str:
    """Arguments as OpenAI sends them, a JSON text: an object as written; a string that some
    models write (JSON inside a JSON string) decoded once."""
    if value.startswith('"'):
        decoded = _json_string(value)
        return decoded if decoded is not None else value
    return value
