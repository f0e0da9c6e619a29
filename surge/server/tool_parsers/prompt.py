"""Tools for a chat template that renders none (SmolLM2's, and most base templates): the tools
go into the system message in the parser's own syntax, earlier calls are written as the model
would write them, and tools' answers come back as user turns, so that the conversation of an
agent loop renders with any template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from surge.server.tool_parsers.base import ToolParser


def renders_tools(template: str | None) -> bool:
    """Whether a chat template shows the request's tools itself (it reads `tools`)."""
    return template is not None and "tools" in template


def with_tools_prompt(
    parser: ToolParser,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = [
                parser.format_call(str(f.get("name", "")), str(f.get("arguments") or "{}"))
                for c in m["tool_calls"]
                if isinstance(c, Mapping) and isinstance(f := c.get("function"), Mapping)
            ]
            text = m.get("content") or ""
            lines = [text, *calls] if text else calls
            out.append({"role": "assistant", "content": "\n".join(lines)})
        elif role == "tool":
            out.append({"role": "user", "content": parser.format_result(str(m.get("content")))})
        else:
            out.append(dict(m))
    if tools:
        prompt = parser.tools_prompt(tools)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{prompt}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
