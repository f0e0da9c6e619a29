"""OpenAI-compatible response bodies and stream chunks, shaped as the `openai` client parses.

OpenAI sends `"logprobs": null` and `"finish_reason": null` explicitly, so these models dump
with None kept; only a chat delta drops unset keys, and only a stream with include_usage
carries `"usage"` at all.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

SSE_DONE = "data: [DONE]\n\n"


def new_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


def new_chat_completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def _unix_now() -> int:
    return int(time.time())


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TokenizeResponse(_Model):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(_Model):
    prompt: str


class ModelCard(_Model):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_unix_now)
    owned_by: str = "surge"
    root: str | None = None  # what it was loaded from (vLLM's field)
    parent: str | None = None  # a LoRA adapter's base model
    max_model_len: int | None = None


class ModelList(_Model):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


class PromptTokensDetails(_Model):
    cached_tokens: int = 0


class UsageInfo(_Model):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(
        cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> UsageInfo:
        details = (
            None if cached_tokens is None else PromptTokensDetails(cached_tokens=cached_tokens)
        )
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=details,
        )


class _StreamChunk(_Model):
    # Subclasses declare `usage: UsageInfo | None` last, where OpenAI puts it.

    def to_sse(self, *, include_usage: bool) -> str:
        """One SSE event. With include_usage every chunk carries `usage` (null until the last)."""
        payload = self.model_dump_json(exclude=None if include_usage else {"usage"})
        return f"data: {payload}\n\n"


class CompletionLogProbs(_Model):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


# vLLM's prompt_logprobs: per prompt token (None for the first), {token id: its logprob, rank
# and text} for the token itself and the top alternatives.
PromptLogprobs = list[dict[str, dict[str, Any]] | None]


class CompletionChoice(_Model):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"; null while streaming
    prompt_logprobs: PromptLogprobs | None = None  # only when asked for
    # return_token_ids (vLLM): the choice's prompt (first chunk of a stream) and its tokens
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None

    @model_serializer(mode="wrap")
    def _omit_no_prompt_logprobs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self), "prompt_logprobs", "prompt_token_ids", "token_ids")


class CompletionResponse(_Model):
    id: str = Field(default_factory=new_completion_id)
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_unix_now)
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class CompletionStreamResponse(_StreamChunk):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_unix_now)
    model: str
    choices: list[CompletionChoice] = Field(default_factory=list)
    usage: UsageInfo | None = None


class ChatLogProb(_Model):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogProbsContent(ChatLogProb):
    top_logprobs: list[ChatLogProb] = Field(default_factory=list)


class ChatChoiceLogProbs(_Model):
    content: list[ChatLogProbsContent] | None = None


class ChatResponseMessage(_Model):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning: str | None = None  # --reasoning-parser: the thinking (vLLM's field)
    tool_calls: list[dict[str, Any]] | None = None

    @model_serializer(mode="wrap")
    def _omit_no_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for key in ("tool_calls", "reasoning"):  # absent, as OpenAI sends a plain answer
            if out.get(key) is None:
                out.pop(key, None)
        return out


class ChatCompletionChoice(_Model):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogProbs | None = None
    finish_reason: str | None = "stop"
    token_ids: list[int] | None = None  # return_token_ids (vLLM)

    @model_serializer(mode="wrap")
    def _omit_no_token_ids(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self), "token_ids")


class ChatCompletionResponse(_Model):
    id: str = Field(default_factory=new_chat_completion_id)
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_unix_now)
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None  # only when asked for (vLLM)
    prompt_token_ids: list[int] | None = None  # return_token_ids (vLLM)

    @model_serializer(mode="wrap")
    def _omit_no_prompt_logprobs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self), "prompt_logprobs", "prompt_token_ids")


def _without_none(out: dict[str, Any], *keys: str) -> dict[str, Any]:
    for key in keys:
        if out.get(key) is None:
            out.pop(key, None)
    return out


class DeltaMessage(_Model):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # OpenAI sends `{"role": "assistant", "content": ""}` first, then `{"content": ...}`,
        # and `{}` in the finishing chunk: absent keys, not nulls.
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatCompletionStreamChoice(_Model):
    index: int
    delta: DeltaMessage = Field(default_factory=DeltaMessage)
    logprobs: ChatChoiceLogProbs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # return_token_ids: this chunk's tokens

    @model_serializer(mode="wrap")
    def _omit_no_token_ids(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self), "token_ids")


class ChatCompletionStreamResponse(_StreamChunk):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_unix_now)
    model: str
    choices: list[ChatCompletionStreamChoice] = Field(default_factory=list)
    prompt_token_ids: list[int] | None = None  # return_token_ids: in the first chunk
    usage: UsageInfo | None = None

    @model_serializer(mode="wrap")
    def _omit_no_prompt_ids(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler(self), "prompt_token_ids")
