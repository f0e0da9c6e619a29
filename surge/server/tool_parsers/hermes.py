"""Hermes' tool calls (Qwen2.5/3, Hermes 2/3, SmolLM3 and many fine-tunes): JSON objects
between `<tool_call>` and `</tool_call>`, after any text the model writes first."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from surge.server.tool_parsers.base import (
    PartialCall,
    Reading,
    ToolParser,
    held_back,
    tools_json_lines,
)
from surge.server.tool_parsers.json_call import read_json_call, value_end

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolParser):
    name = "hermes"

    def read(self, text: str, final: bool) -> Reading:
        first = text.find(OPEN)
        if first < 0:
            return Reading(text if final else text[: len(text) - held_back(text, OPEN)])
        # The answer is the text before the first call; what follows the calls is dropped.
        calls: list[PartialCall] = []
        start = first
        while start >= 0:
            body_start = start + len(OPEN)
            end = _close(text, body_start)
            body = text[body_start:] if end < 0 else text[body_start:end]
            calls.append(read_json_call(body, ended=end >= 0 or final))
            if end < 0:
                break
            start = text.find(OPEN, end + len(CLOSE))
        return Reading(text[:first], calls)

    def tools_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{tools_json_lines(tools)}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments "
            "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def format_call(self, name: str, arguments: str) -> str:
        return f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": {arguments or "{}"}}}\n{CLOSE}'


def _close(text: str, body_start: int) -> int:
    """Where the call that begins at `body_start` closes (-1: not yet). The marker is looked for
    after the JSON object, so one written inside an argument's string does not end the call."""
    i = len(text) - len(text[body_start:].lstrip())
    if text[i : i + 1] == "{":
        end = value_end(text, i)
        return -1 if end is None else text.find(CLOSE, end)
    return text.find(CLOSE, body_start)
