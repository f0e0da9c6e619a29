"""OpenAI-compatible request models, as vLLM's server accepts them (responses: protocol_responses).

Requests ignore unknown fields (clients send many we do not use) but reject wrong types:
the Strict* annotations stop pydantic from coercing "12" to 12 or true to 1. Value ranges are
checked once, by SamplingParams, in `to_sampling_params`, which maps failures to a 400.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import EllipsisType
from typing import Any, ClassVar, Literal

from pydantic import (
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from surge.sampling_params import SamplingParams, effective_max_tokens
from surge.server.errors import BadRequestError
from surge.server.protocol_messages import (
    ChatMessage,
    StreamOptions,
    _Model,
    _non_empty_messages,
    _reworded,
    template_messages,
)
from surge.server.protocol_structured import (
    NamedToolChoice,
    ResponseFormat,
    StructuredOutputsParams,
    ToolSpec,
    structured_output_of,
    tool_plan_of,
    with_tool_plan,
)
from surge.server.tools import ToolPlan
from surge.structured_output import StructuredOutput

MAX_N = 16  # choices per prompt; each one is a full sequence in the batch


_PARAM_RE = re.compile(r"^([a-z_]+) ")


class _SamplingRequest(_Model):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI + vLLM extras)."""

    # Some clients send `"n": null` for "not set"; these fields then take their default.
    _NULL_IS_DEFAULT: ClassVar[frozenset[str]] = frozenset(
        {
            "n",
            "stream",
            "echo",
            "min_tokens",
            "ignore_eos",
            "include_stop_str_in_output",
            "skip_special_tokens",
            "priority",
            "add_generation_prompt",
        }
    )

    model: StrictStr | None = None  # None: the served model
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    user: StrictStr | None = None
    echo: StrictBool = False
    logit_bias: dict[StrictStr, StrictFloat] | None = None  # token id (as a string) -> bias
    # vLLM extras
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    min_tokens: StrictInt = 0
    ignore_eos: StrictBool = False
    repetition_penalty: StrictFloat | None = None
    stop_token_ids: list[StrictInt] | None = None
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    priority: StrictInt = 0
    request_id: StrictStr | None = None
    cache_salt: StrictStr | None = None
    allowed_token_ids: list[StrictInt] | None = None
    bad_words: list[StrictStr] | None = None
    prompt_logprobs: StrictInt | None = None
    # Greedy output the same whatever else is in the batch (as the server's --batch-invariant)
    batch_invariant: StrictBool = False
    # vLLM's: the prompt's and each choice's token ids in the answer (RL trainers need the
    # very tokens sampled, not a re-tokenization); logprobs' tokens as "token_id:{id}".
    return_token_ids: StrictBool = False
    return_tokens_as_token_ids: StrictBool = False
    # Structured output: OpenAI's response_format, vLLM's structured_outputs and guided_* fields
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_json: dict[str, Any] | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in cls._NULL_IS_DEFAULT}
        return data

    _check_stop = field_validator("stop", mode="wrap")(
        _reworded("stop must be a string or a list of strings")
    )

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if value is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (and every other chunk has usage: null)."""
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk carries the usage so far (vLLM's continuous_usage_stats)."""
        options = self.stream_options
        return self.include_usage and options is not None and options.continuous_usage_stats

    def structured_output(self) -> StructuredOutput | None:
        """What the output must match, validated; 400 naming the field otherwise."""
        guided = (self.guided_json, self.guided_regex, self.guided_choice, self.guided_grammar)
        return structured_output_of(self.response_format, self.structured_outputs, guided)

    @property
    def requested_max_tokens(self) -> int | None:
        """The output length the request names; None: it names none."""
        raise NotImplementedError

    def context_room(self, prompt_lens: Sequence[int], max_model_len: int, *, param: str) -> int:
        """What the context leaves for output after the longest prompt; the 400s of
        `check_context_length` (code context_length_exceeded) for a prompt that leaves none or a
        max_tokens that asks for more. With `to_sampling_params(room=...)`, chat and completions
        get their max_tokens here and from `effective_max_tokens`, nowhere else."""
        for n in prompt_lens:
            check_context_length(n, self.requested_max_tokens, max_model_len, param=param)
        return max_model_len - max(prompt_lens)

    def _sampling_params(
        self,
        *,
        room: int,
        default_max_tokens: int | None,
        logprobs: int | None,
        renames: Mapping[str, str],
        structured: StructuredOutput | None,
        prompt_logprobs: int | None = None,
        defaults: Mapping[str, float] | None = None,  # the model's (generation_config.py)
    ) -> SamplingParams:
        d = defaults or {}
        if not 1 <= self.n <= MAX_N:
            raise BadRequestError(f"n must be between 1 and {MAX_N}, got {self.n}", param="n")
        if self.stream and prompt_logprobs is not None:
            raise BadRequestError(
                "prompt logprobs (prompt_logprobs, or echo with logprobs) come with a whole "
                "answer: send stream false",
                param="prompt_logprobs" if self.prompt_logprobs is not None else "echo",
            )
        try:
            return SamplingParams(
                n=self.n,
                temperature=_or(self.temperature, d.get("temperature", 1.0)),
                top_p=_or(self.top_p, d.get("top_p", 1.0)),
                top_k=int(_or(self.top_k, d.get("top_k", 0))),
                min_p=_or(self.min_p, d.get("min_p", 0.0)),
                seed=self.seed,
                presence_penalty=self.presence_penalty or 0.0,
                frequency_penalty=self.frequency_penalty or 0.0,
                repetition_penalty=_or(self.repetition_penalty, d.get("repetition_penalty", 1.0)),
                max_tokens=effective_max_tokens(
                    self.requested_max_tokens, room, default_max_tokens
                ),
                min_tokens=self.min_tokens,
                stop=(self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ()),
                stop_token_ids=tuple(self.stop_token_ids or ()),
                ignore_eos=self.ignore_eos,
                logprobs=logprobs,
                include_stop_str_in_output=self.include_stop_str_in_output,
                skip_special_tokens=self.skip_special_tokens,
                structured=structured,
                logit_bias=_token_bias(self.logit_bias),
                allowed_token_ids=(
                    None if self.allowed_token_ids is None else tuple(self.allowed_token_ids)
                ),
                bad_words=tuple(self.bad_words or ()),
                prompt_logprobs=prompt_logprobs,
                batch_invariant=self.batch_invariant,
            )
        except ValueError as exc:
            raise sampling_error(str(exc), renames) from exc


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _token_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: JSON keys are strings, each a token id."""
    try:
        return tuple((int(k), v) for k, v in (bias or {}).items())
    except ValueError:
        raise ValueError(f"logit_bias keys must be token ids, got {list(bias or {})}") from None


def sampling_error(message: str, renames: Mapping[str, str] | None = None) -> BadRequestError:
    """A 400 for a SamplingParams ValueError: its messages start with the offending field
    ("top_p must be in (0, 1]..."), which becomes the param (renamed where the API differs)."""
    renames = renames or {}
    match = _PARAM_RE.match(message)
    if match is None:
        return BadRequestError(message)
    field = match.group(1)
    param = renames.get(field, field)
    return BadRequestError(param + message[len(field) :], param=param)


def _check_token_ids(ids: Sequence[int], what: str) -> None:
    if any(t < 0 for t in ids):
        raise ValueError(f"{what} must contain only token ids >= 0")


class CompletionRequest(_SamplingRequest):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = 16  # None: fill the context (default_max_tokens)
    logprobs: StrictInt | None = None  # OpenAI allows 0..5; we allow up to 20 like vLLM

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _check_prompt(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            prompt = handler(value)
        except ValidationError:
            raise ValueError(
                "prompt must be a string, a list of strings, a list of token ids, "
                "or a list of token-id lists"
            ) from None
        if isinstance(prompt, list):
            if not prompt:
                raise ValueError("prompt must not be an empty list")
            for item in prompt:
                if isinstance(item, list):
                    if not item:
                        raise ValueError("prompt must not contain an empty token list")
                    _check_token_ids(item, "prompt")
            if isinstance(prompt[0], int):
                _check_token_ids(prompt, "prompt")
        return prompt

    def prompt_list(self) -> list[str | list[int]]:
        """The prompts of the batch: each a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [[t for t in p if isinstance(t, int)]]
        return [x for x in p if not isinstance(x, int)]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def to_sampling_params(
        self,
        *,
        room: int,
        default_max_tokens: int | None = None,
        defaults: Mapping[str, float] | None = None,
    ) -> SamplingParams:
        """Engine settings; raises BadRequestError(param=...) for any out-of-range value.
        `room`: the output the context leaves (`context_room`); `default_max_tokens`: the
        server's, for a request that names none (None: all the room); `defaults`: the model's,
        for the sampling fields the request leaves out."""
        prompt_logprobs = self.prompt_logprobs
        if self.echo and self.logprobs is not None:  # OpenAI's echo scores the prompt too
            prompt_logprobs = max(prompt_logprobs or 0, self.logprobs)
        return self._sampling_params(
            room=room,
            default_max_tokens=default_max_tokens,
            logprobs=self.logprobs,
            renames={},
            structured=self.structured_output(),
            prompt_logprobs=prompt_logprobs,
            defaults=defaults,
        )


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: StrictInt | None = None  # deprecated by OpenAI; max_completion_tokens wins
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    functions: list[dict[str, Any]] | None = None
    add_generation_prompt: StrictBool = True
    # vLLM: the last (assistant) message is left open and the model writes on from its end.
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: StrictStr | None = None  # OpenAI's; the template reads it (gpt-oss)

    _NULL_IS_DEFAULT: ClassVar[frozenset[str]] = _SamplingRequest._NULL_IS_DEFAULT | {"logprobs"}

    _check_messages = field_validator("messages")(_non_empty_messages)

    @model_validator(mode="after")
    def _check_continue(self) -> ChatCompletionRequest:
        return _check_continuation(self)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs", False):
            raise ValueError("top_logprobs is only allowed when logprobs is true")
        return value

    @field_validator("functions")
    @classmethod
    def _no_functions(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if value:
            raise ValueError("functions (deprecated by OpenAI) are not supported; send tools")
        return value

    def tool_plan(self, auto_tools: bool = False) -> ToolPlan | None:
        """How tool_choice holds the output, or None when it does not (400 for "auto" unless
        the server reads calls back: `auto_tools`)."""
        return tool_plan_of(self.tools, self.tool_choice, auto_tools)

    def auto_tools(self) -> bool:
        """Whether the model chooses between answering and calling the tools."""
        return bool(self.tools) and self.tool_choice in (None, "auto")

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them (None: the template shows none)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def template_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)

    @property
    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens, else the deprecated max_tokens."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def to_sampling_params(
        self,
        *,
        room: int,
        default_max_tokens: int | None = None,
        plan: ToolPlan | EllipsisType | None = ...,
        defaults: Mapping[str, float] | None = None,
    ) -> SamplingParams:
        """Engine settings; raises BadRequestError(param=...) for any out-of-range value.
        `room`, `default_max_tokens`, `defaults`: as CompletionRequest's; `plan`: the request's
        tool plan, when the caller has it already."""
        if isinstance(plan, EllipsisType):
            plan = self.tool_plan()
        structured = with_tool_plan(plan, self.structured_output())
        renames = {"logprobs": "top_logprobs"}
        if self.max_completion_tokens is not None:
            renames["max_tokens"] = "max_completion_tokens"
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling_params(
            room=room,
            default_max_tokens=default_max_tokens,
            logprobs=logprobs,
            renames=renames,
            structured=structured,
            prompt_logprobs=self.prompt_logprobs,
            defaults=defaults,
        )


def _check_continuation(body: Any) -> Any:
    """continue_final_message leaves the last message open: it must be the assistant's, and no
    new turn can open after it (add_generation_prompt is implied false unless sent true)."""
    if not body.continue_final_message:
        return body
    if "add_generation_prompt" in body.model_fields_set and body.add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    body.add_generation_prompt = False
    if body.messages and body.messages[-1].role != "assistant":
        raise ValueError("continue_final_message needs an assistant message last")
    return body


def check_context_length(
    prompt_tokens: int, max_tokens: int | None, max_model_len: int, *, param: str = "messages"
) -> None:
    """400 (code context_length_exceeded) when the prompt plus output cannot fit the context."""
    if prompt_tokens >= max_model_len:
        raise BadRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt has {prompt_tokens} tokens, leaving no room for output.",
            param=param,
            code="context_length_exceeded",
        )
    if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
        raise BadRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_tokens} in the completion). Please reduce the prompt or max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )
