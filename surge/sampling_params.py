"""Per-request sampling settings, validated once when the request arrives."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from surge.structured_output import StructuredOutput

# Temperatures below this are treated as greedy (as vLLM does): dividing logits by a near-zero
# temperature overflows float32 to inf and turns the softmax into NaN.
GREEDY_TEMPERATURE_EPS = 1e-5
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]


def _check_int(name: str, value: object) -> int:
    # bool is an int subclass, but `n=True` is certainly a mistake.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


def _check_float(name: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _normalise_stop(value: object) -> tuple[str, ...]:
    return _normalise_strings("stop", value)


def _normalise_strings(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a string or a list of strings, got {value!r}")
    out: list[str] = []
    for s in value:
        if not isinstance(s, str) or not s or (name == "bad_words" and not s.strip()):
            raise ValueError(f"{name} must contain only non-empty strings, got {s!r}")
        out.append(s)
    return tuple(out)


def _normalise_stop_token_ids(value: object) -> tuple[int, ...]:
    return _normalise_token_ids("stop_token_ids", value)


def _normalise_token_ids(name: str, value: object) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a list of integers, got {value!r}")
    out: list[int] = []
    for t in value:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"{name} must contain only integers >= 0, got {t!r}")
        out.append(t)
    return tuple(out)


def _normalise_logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """{token id: bias} (or pairs) -> sorted pairs; ids may be strings, as JSON keys are."""
    items = value.items() if isinstance(value, Mapping) else value
    if not isinstance(items, Iterable) or isinstance(items, str | bytes):
        raise ValueError(f"logit_bias must map token ids to numbers, got {value!r}")
    out: dict[int, float] = {}
    for item in items:
        try:
            key, bias = item
            token = int(key) if isinstance(key, str) else _check_int("logit_bias", key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys must be token ids, got {item!r}") from None
        if token < 0:
            raise ValueError(f"logit_bias keys must be token ids >= 0, got {token}")
        b = _check_float("logit_bias", bias)
        if not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias values must be in [-100, 100], got {b} for {token}")
        out[token] = b
    return tuple(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens for one request, and when to stop (OpenAI / vLLM semantics)."""

    n: int = 1  # >= 1 completions per prompt
    temperature: float = 1.0  # >= 0; 0 means greedy
    top_p: float = 1.0  # (0, 1]
    top_k: int = 0  # 0 or -1: disabled; else >= 1
    min_p: float = 0.0  # [0, 1], relative to the most likely token
    seed: int | None = None
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # > 0 (1 = off); on prompt and output tokens, as vLLM/HF
    max_tokens: int | None = 16  # >= 1; None: until the context is full
    min_tokens: int = 0  # >= 0 and <= max_tokens
    stop: tuple[str, ...] = ()  # a str or list is accepted and normalised to a tuple
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; 0..20: sampled token's logprob + that many top ones
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: StructuredOutput | None = None  # the text must match this (JSON schema, regex...)
    # Added to the logits of these token ids (OpenAI's logit_bias; a dict is accepted).
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None  # only these may be generated (vLLM)
    bad_words: tuple[str, ...] = ()  # words never generated (vLLM): their last token is banned
    # Log-probability of each prompt token given those before it (and this many alternatives),
    # as vLLM's prompt_logprobs; None: none. Such a prompt is computed, not read from the cache.
    prompt_logprobs: int | None = None
    # This request's greedy output the same whatever else is in the batch (engine-wide:
    # --batch-invariant): the steps it is in run one kernel for 1 and N rows.
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        if _check_int("n", self.n) < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if _check_float("temperature", self.temperature) < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < _check_float("top_p", self.top_p) <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        top_k = _check_int("top_k", self.top_k)
        if top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled) or >= 1, got {top_k}")
        if not 0.0 <= _check_float("min_p", self.min_p) <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            _check_int("seed", self.seed)
        for name in ("presence_penalty", "frequency_penalty"):
            value = _check_float(name, getattr(self, name))
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if _check_float("repetition_penalty", self.repetition_penalty) <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_tokens is not None and _check_int("max_tokens", self.max_tokens) < 1:
            raise ValueError(f"max_tokens must be >= 1 or None, got {self.max_tokens}")
        if _check_int("min_tokens", self.min_tokens) < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}"
            )
        if self.logprobs is not None:
            logprobs = _check_int("logprobs", self.logprobs)
            if not 0 <= logprobs <= MAX_LOGPROBS:
                raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}] or None, got {logprobs}")
        if self.prompt_logprobs is not None:
            k = _check_int("prompt_logprobs", self.prompt_logprobs)
            if not 0 <= k <= MAX_LOGPROBS:
                raise ValueError(f"prompt_logprobs must be in [0, {MAX_LOGPROBS}] or None, got {k}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise ValueError(f"structured must be a StructuredOutput, got {self.structured!r}")
        # Frozen dataclass: normalising needs object.__setattr__.
        object.__setattr__(self, "stop", _normalise_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", _normalise_stop_token_ids(self.stop_token_ids))
        object.__setattr__(self, "logit_bias", _normalise_logit_bias(self.logit_bias))
        if self.allowed_token_ids is not None:
            allowed = _normalise_token_ids("allowed_token_ids", self.allowed_token_ids)
            if not allowed:
                raise ValueError("allowed_token_ids must not be empty")
            object.__setattr__(self, "allowed_token_ids", allowed)
        object.__setattr__(self, "bad_words", _normalise_strings("bad_words", self.bad_words))

    def check_vocab(self, vocab_size: int) -> None:
        """ValueError naming the field when a token id lies outside the vocabulary."""
        for name, ids in (
            ("logit_bias", [t for t, _ in self.logit_bias]),
            ("allowed_token_ids", self.allowed_token_ids or ()),
        ):
            if bad := [t for t in ids if t >= vocab_size]:
                raise ValueError(
                    f"{name} has token ids outside the vocabulary [0, {vocab_size}): {bad}"
                )

    @property
    def is_greedy(self) -> bool:
        """True when the next token is always the most likely one (no randomness)."""
        return self.temperature < GREEDY_TEMPERATURE_EPS or self.top_k == 1


def effective_max_tokens(requested: int | None, room: int, default: int | None = None) -> int:
    """The most tokens a request may generate, `room` being what the context leaves after its
    prompt: what it asked for, else `default` (the server's --default-max-tokens or the model's
    max_new_tokens), else all the room; never more than the room. The engine clamps with this;
    the server answers 400 first to a request that asks for more than the room
    (surge/server/protocol.py: `_SamplingRequest.context_room`)."""
    if requested is None:
        requested = room if default is None else default
    return min(requested, room)
