"""Mistral's tool calls (Mistral 7B Instruct v0.3, Mixtral, Mistral Small/NeMo): the answer is
`[TOOL_CALLS]` then a JSON list, `[{"name": ..., "arguments": {...}}, ...]`. [TOOL_CALLS] is a
control token that detokenizing drops, so a list at the start of the answer that names the
request's tools is read as calls too; other text is content."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from surge.server.tool_parsers.base import (
    PartialCall,
    Reading,
    ToolParser,
    after_tag,
    tools_json_lines,
)
from surge.server.tool_parsers.json_call import read_json_call, value_end

TAG = "[TOOL_CALLS]"


class MistralParser(ToolParser):
    name = "mistral"

    def read(self, text: str, final: bool) -> Reading:
        body = after_tag(text, final, TAG)
        if body is None:
            return Reading("")  # nothing yet, or maybe the tag
        if not body.startswith("["):
            return Reading(text)
        calls: list[PartialCall] = []
        i = 1
        while True:
            while i < len(body) and body[i] in " \t\r\n,":
                i += 1
            if i >= len(body) or body[i] == "]":
                break
            if body[i] != "{":
                return Reading(text)  # a list, but not of calls: an answer
            end = value_end(body, i)
            ended = end is not None or final
            call = read_json_call(body[i:] if end is None else body[i:end], ended)
            if call.name is not None and call.name not in self.tool_names:
                return Reading(text)
            calls.append(call)
            if end is None:
                break
            i = end
        closed = i < len(body) and body[i] == "]"
        if final and not calls:
            return Reading(text)
        if final and not closed:  # the list never closed (cut by max_tokens): malformed
            calls.append(PartialCall(None, "", done=True, valid=False))
        return Reading("", calls)

    def tools_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        return (
            "You can call these functions:\n" + tools_json_lines(tools) + "\nTo call them, "
            f'answer only {TAG}[{{"name": <function-name>, "arguments": <args-json-object>}}, ...]'
        )

    def format_call(self, name: str, arguments: str) -> str:
        return f'{TAG}[{{"name": {json.dumps(name)}, "arguments": {arguments or "{}"}}}]'
