"""vLLM's /tokenize and /detokenize request bodies."""

from __future__ import annotations

from typing import Any

from pydantic import StrictBool, StrictInt, StrictStr, field_validator, model_validator

from surge.server.protocol import _check_continuation, _check_token_ids
from surge.server.protocol_messages import (
    ChatMessage,
    _Model,
    _non_empty_messages,
    template_messages,
)
from surge.server.protocol_structured import ToolSpec


class TokenizeRequest(_Model):
    """vLLM /tokenize: either `prompt` or `messages` (rendered as /v1/chat/completions renders
    them: the chat template, the tools, an open final message)."""

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    add_special_tokens: StrictBool | None = None  # None: True for prompt, False for messages
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: StrictStr | None = None
    tools: list[ToolSpec] | None = None

    @model_validator(mode="after")
    def _exactly_one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt or messages is required")
        if self.messages is not None:
            _non_empty_messages(self.messages)
        return _check_continuation(self)

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages or [])

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def wants_special_tokens(self) -> bool:
        # A chat template already writes BOS and friends; adding them again would double them.
        if self.add_special_tokens is not None:
            return self.add_special_tokens
        return self.messages is None


class DetokenizeRequest(_Model):
    model: StrictStr | None = None
    tokens: list[StrictInt]

    @field_validator("tokens")
    @classmethod
    def _valid_ids(cls, tokens: list[int]) -> list[int]:
        _check_token_ids(tokens, "tokens")
        return tokens
