"""OpenAI's Responses API (POST /v1/responses), as a chat request underneath.

A request's `instructions` and `input` (a string, or items: messages, earlier function calls and
their outputs) become chat messages; function tools, `tool_choice` and `text.format` become the
chat fields they mirror. A stored response (`store`, true by default as OpenAI's) lets the next
turn name it in `previous_response_id` instead of resending the conversation: its items come
first, then this request's `input`; its `instructions` are not carried over (OpenAI's rule).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

from surge.server.errors import BadRequestError
from surge.server.tools import ToolCall

_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    input: StrictStr | list[dict[str, Any]]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    stream: StrictBool = False
    background: StrictBool = False  # answer at once (queued); poll GET /v1/responses/{id}
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None  # {"effort": ...}: the chat's reasoning_effort
    metadata: dict[str, StrictStr] | None = None
    user: StrictStr | None = None
    previous_response_id: StrictStr | None = None
    store: StrictBool | None = None
    # vLLM's extras that /v1/chat/completions takes too
    seed: StrictInt | None = None
    top_k: StrictInt | None = None
    priority: StrictInt | None = None
    request_id: StrictStr | None = None
    cache_salt: StrictStr | None = None
    structured_outputs: dict[str, Any] | None = None

    def input_items(self) -> list[dict[str, Any]]:
        """`input` as items, each with an id and its content as parts (as OpenAI lists them)."""
        if isinstance(self.input, str):
            return [_message("user", self.input)]
        return [_input_item(item) for item in self.input]

    def chat_fields(
        self, items: list[dict[str, Any]], earlier: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The /v1/chat/completions body this request amounts to, its input `items` after the
        `earlier` conversation (a previous response's); 400 for what has none."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        messages += _messages(earlier or []) + _messages(items)
        if not messages:
            raise BadRequestError("input must not be empty", param="input")
        fields: dict[str, Any] = {"model": self.model, "messages": messages, "stream": False}
        optional = {
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "user": self.user,
            "seed": self.seed,
            "top_k": self.top_k,
            "priority": self.priority,
            "request_id": self.request_id,
            "cache_salt": self.cache_salt,
            "structured_outputs": self.structured_outputs,
        }
        fields |= {k: v for k, v in optional.items() if v is not None}
        if self.tools:
            fields["tools"] = [_chat_tool(t) for t in self.tools]
        if self.tool_choice is not None:
            fields["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.reasoning is not None and isinstance(effort := self.reasoning.get("effort"), str):
            fields["reasoning_effort"] = effort
        if self.text is not None and (fmt := self.text.get("format")) is not None:
            fields["response_format"] = _response_format(fmt)
        return fields


def _message(role: str, text: str) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {
        "type": "message",
        "id": new_id("msg"),
        "status": "completed",
        "role": role,
        "content": [{"type": part, "text": text}],
    }


def _input_item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind == "message" and isinstance(item.get("content"), str):
        return {**_message(str(item.get("role")), item["content"]), **_id(item)}
    prefix = {"message": "msg", "function_call": "fc"}.get(kind, "item")
    return {"type": kind, "id": new_id(prefix), **item}


def _id(item: dict[str, Any]) -> dict[str, Any]:
    return {"id": item["id"]} if isinstance(item.get("id"), str) else {}


def _messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequestError(f"input[{i}].role: unknown role {role!r}", param="input")
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _text(item.get("content"), i)})
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            call = {"id": item.get("call_id"), "type": "function", "function": function}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, i)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # a reasoning model's summary: not shown to this model
        else:
            raise BadRequestError(
                f"input[{i}]: items of type {kind!r} are not supported", param="input"
            )
    return out


def _text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequestError(
                    f"input[{i}].content: {kind!r} parts are not supported (text only)",
                    param="input",
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise BadRequestError(f"input[{i}].content must be a string or a list of parts", param="input")


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise BadRequestError(
            f"tools: {tool.get('type')!r} tools are not supported (function tools only)",
            param="tools",
        )
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise BadRequestError(
        f"tool_choice: {choice.get('type')!r} is not supported", param="tool_choice"
    )


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise BadRequestError(f"text.format: unknown type {kind!r}", param="text.format")


# -- the response -------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content if status == "completed" else [],
    }


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "status": status,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def output_items(
    content: str | None, calls: list[ToolCall], reasoning: str | None = None
) -> list[dict[str, Any]]:
    items = [reasoning_item(new_id("rs"), reasoning)] if reasoning else []
    if content or not calls:
        items.append(message_item(new_id("msg"), content or ""))
    return items + [call_item(new_id("fc"), c) for c in calls]


def response_body(
    body: ResponsesRequest,
    model: str,
    response_id: str,
    created_at: int,
    status: str,  # in_progress | completed | incomplete
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    store: bool,
) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": body.previous_response_id,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "text": body.text or {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": body.metadata or {},
        "store": store,
        "user": body.user,
        "usage": usage,
        "background": body.background,
    }


def usage_body(prompt_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "total_tokens": prompt_tokens + output_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def unix_now() -> int:
    return int(time.time())
