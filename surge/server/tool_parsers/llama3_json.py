"""Llama 3.1/3.2/3.3's JSON tool calls: the answer is `{"name": ..., "parameters": {...}}` (after
`<|python_tag|>` or not), several joined by `;`. Plain text, or JSON that does not name one of
the request's tools, is content."""

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

TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"

    def read(self, text: str, final: bool) -> Reading:
        body = after_tag(text, final, TAG)
        if body is None:
            return Reading("")  # nothing yet, or maybe the tag
        if not body.startswith("{"):
            return Reading(text)
        calls: list[PartialCall] = []
        i = 0
        while i < len(body):
            end = value_end(body, i)
            ended = end is not None or final
            call = read_json_call(body[i:] if end is None else body[i:end], ended)
            if call.name is not None and call.name not in self.tool_names:
                return Reading(text)  # JSON, but not a call of these tools: an answer
            calls.append(call)
            if end is None:
                break
            rest = body[end:].lstrip()
            if rest[:1] == ";":
                rest = rest[1:].lstrip()
            elif rest:
                calls.append(PartialCall(None, "", done=True, valid=False))  # text after a call
                break
            i = len(body) - len(rest)
        if final and not calls:
            return Reading(text)
        return Reading("", calls)

    def tools_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        return (
            "You have access to the following functions. To call a function, respond only with "
            'JSON of the form {"name": function name, "parameters": dictionary of argument '
            "name and its value}. Do not use variables.\n\n" + tools_json_lines(tools)
        )

    def format_call(self, name: str, arguments: str) -> str:
        return f'{{"name": {json.dumps(name)}, "parameters": {arguments or "{}"}}}'
