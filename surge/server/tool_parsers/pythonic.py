"""Python-style tool calls (Llama 3.2 1B/3B, Llama 4, ToolACE): the answer is a list of calls,
`[get_weather(city="Paris"), get_time(zone="CET")]`, keyword arguments with literal values.
A list is read when it closes; text that does not begin like one is content."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from surge.server.tool_parsers.base import PartialCall, Reading, ToolParser, tools_json_lines

_START = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\(")
_MAYBE_START = re.compile(r"\[\s*(?:[A-Za-z_][\w.]*\s*)?\Z")


class PythonicParser(ToolParser):
    name = "pythonic"

    def read(self, text: str, final: bool) -> Reading:
        body = text.strip()
        if not body.startswith("["):
            return Reading(text if final or body else "")
        if not _START.match(body):
            if not final and _MAYBE_START.match(body):
                return Reading("")  # "[get_wea": may still become a call
            return Reading(text)
        calls = _parse(body)
        if calls is None:
            return Reading(text) if final else Reading("")
        if any(c.name not in self.tool_names for c in calls):
            return Reading(text)
        return Reading("", calls)

    def tools_prompt(self, tools: Sequence[Mapping[str, Any]]) -> str:
        return (
            "You can call functions. To call them, answer with only a Python list of calls, "
            '[func_name1(param1="value1", param2=2), func_name2(param=True)], and no other '
            "text. The functions:\n" + tools_json_lines(tools)
        )

    def format_call(self, name: str, arguments: str) -> str:
        args = json.loads(arguments or "{}")
        kwargs = ", ".join(f"{k}={v!r}" for k, v in args.items())
        return f"[{name}({kwargs})]"


def _parse(body: str) -> list[PartialCall] | None:
    """The calls of a whole list, or None while it is unfinished (or not one)."""
    try:
        tree = ast.parse(body, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(tree, ast.List):
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            return None
        try:
            name = ast.unparse(node.func)
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            arguments = json.dumps(args, ensure_ascii=False)
        except (ValueError, TypeError):
            return None
        calls.append(PartialCall(name, arguments, done=True))
    return calls
