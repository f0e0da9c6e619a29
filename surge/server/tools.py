"""Tool calls by constrained decoding: `tool_choice` "required" or a named function.

Without a parser for the model family's own tool-call syntax, a server cannot tell a tool call
from text when the model is free to choose ("auto"). When the request says a call must come
("required") or names the function, the output is held by structured output to the call's JSON:

- a named function: the function's `parameters` schema; the whole output is its arguments;
- "required": `[{"name": <one of the tools>, "parameters": {...}}, ...]`, at least one call.

The answer then carries `tool_calls` (arguments as a JSON string, as OpenAI sends them) and
finish_reason "tool_calls".
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from surge.structured_output import StructuredOutput

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = ""

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out["index"] = index
        return out


def tool_calls_finish_reason(engine_reason: str | None) -> str | None:
    """ "tool_calls" for an output that ended by itself with calls, else the engine's reason."""
    return "tool_calls" if engine_reason == "stop" else engine_reason


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tool_choice asks of the output: the constraint, and how to read it."""

    named: str | None  # the named function, or None for "required"
    structured: StructuredOutput

    @classmethod
    def named_function(cls, name: str, parameters: dict[str, Any] | None) -> ToolPlan:
        return cls(name, StructuredOutput.json_schema(parameters or ANY_OBJECT))

    @classmethod
    def required(cls, tools: dict[str, dict[str, Any] | None]) -> ToolPlan:
        call = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "parameters": params or ANY_OBJECT},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for name, params in tools.items()
            ]
        }
        schema = {"type": "array", "items": call, "minItems": 1}
        return cls(None, StructuredOutput.json_schema(schema))

    def answer(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, tool calls) of a finished output. A named call cut by max_tokens keeps
        its partial arguments (a stream has sent them already); a cut "required" list, which
        has no call to show, comes back as text."""
        if self.named is not None:
            return None, [ToolCall(self.named, text, new_call_id())]
        try:
            items = json.loads(text)
        except ValueError:
            return text, []
        calls = [ToolCall(i["name"], json.dumps(i["parameters"]), new_call_id()) for i in items]
        return None, calls

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """ "tool_calls" when the grammar ended the output, else the engine's reason."""
        return tool_calls_finish_reason(engine_reason)
