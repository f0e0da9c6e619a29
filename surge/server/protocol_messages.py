"""Chat messages as OpenAI's API sends them, and as a chat template reads them; the strict
base model every request shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)

Role = Literal["system", "user", "assistant", "tool", "developer"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _reworded(message: str) -> Callable[[Any, Any, ValidatorFunctionWrapHandler], Any]:
    """Wrap validator: a union's per-member errors replaced by one message a human can act on."""

    def validate(cls: Any, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(message) from None

    return validate


class StreamOptions(_Model):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM: usage so far in every chunk


class TextContentPart(_Model):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Model):
    role: Role
    content: StrictStr | list[TextContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: StrictStr | None = None  # a tool's answer: to which call
    # An assistant's earlier thinking, as a reasoning parser answered it (vLLM's `reasoning`,
    # formerly `reasoning_content`); templates such as Qwen3's read `reasoning_content`.
    reasoning: StrictStr | None = None
    reasoning_content: StrictStr | None = None

    _check_content = field_validator("content", mode="wrap")(
        _reworded(
            'content must be a string or a list of {"type": "text", "text": ...} parts '
            "(only text is supported)"
        )
    )


def flatten_message_content(
    content: str | Sequence[TextContentPart | Mapping[str, Any]] | None,
) -> str:
    """One string for the chat template; text parts are joined by newlines, as vLLM does."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = [p.text if isinstance(p, TextContentPart) else str(p.get("text", "")) for p in content]
    return "\n".join(texts)


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as plain dicts with string content, ready for a Jinja chat template."""
    out: list[dict[str, Any]] = []
    for m in messages:
        item: dict[str, Any] = {"role": m.role, "content": flatten_message_content(m.content)}
        if m.name is not None:
            item["name"] = m.name
        if m.tool_calls is not None:
            item["tool_calls"] = m.tool_calls
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        if (thought := m.reasoning_content or m.reasoning) is not None:
            item["reasoning_content"] = item["reasoning"] = thought
        out.append(item)
    return out


def _non_empty_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    if not messages:
        raise ValueError("messages must contain at least one message")
    return messages
