"""ServerConfig: the HTTP side's knobs, one frozen part per concern, built once from the CLI.

Each field with `flag(...)` metadata is a `surge serve` flag, and each part is one argument
group of `surge serve --help` (surge/config/flags.py builds both from these dataclasses).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from surge.batch.config import BatchConfig
from surge.batching.config import BatcherConfig
from surge.config.flags import flag, group
from surge.http.deadline import TIMEOUT_HEADER
from surge.observability.tracing import TracingConfig
from surge.server.reasoning import PARSERS as REASONING_PARSERS
from surge.server.tool_parsers import PARSERS

DEFAULT_QUEUE_WAIT_S = 30.0


def _zero_is_none(value: float) -> float | None:
    return value or None


def _lower(value: str) -> str:
    return value.lower()


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def read_chat_template(value: str | None) -> str | None:
    """--chat-template: a file's text, or the value itself when it is Jinja, not a path."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{" not in value:
        raise SystemExit(f"--chat-template: no such file {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class AuthConfig:
    # empty: no auth
    api_keys: frozenset[str] = field(
        default_factory=frozenset,
        metadata=flag(
            "require this key (repeatable); default from SURGE_API_KEY",
            name="api-key",
            repeat=True,
            default=None,
            env="SURGE_API_KEY",
        ),
    )
    # Who a request is for (fair share, per-tenant limits and metrics), first match wins:
    # this header (a gateway sets it), the body's `user`, the API key (hashed), else "".
    tenant_header: str = field(
        default="x-surge-tenant", metadata=flag("header naming the tenant", to_field=_lower)
    )
    # used when the body has no `priority`
    priority_header: str = field(
        default="x-surge-priority", metadata=flag("header giving the priority", to_field=_lower)
    )


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    max_queued_requests: int = field(
        default=1024, metadata=flag("waiting in the engine + accepted not yet seen by it")
    )
    max_queued_tokens: int | None = field(
        default=None, metadata=flag("prompt tokens waiting; None: no token bound")
    )
    max_queued_requests_per_tenant: int | None = field(
        default=None,
        metadata=flag("queued requests one tenant may hold (default: only the shared bound)"),
    )
    # Refuse (429) a request whose estimated wait for its first token is longer (queue_wait.py),
    # and shed one admitted that still has none by then. None: the request timeout, at most
    # DEFAULT_QUEUE_WAIT_S (a request that would time out before its first token is refused at
    # once rather than after its timeout; 30 s is a twentieth of the default 600 s timeout);
    # 0: no bound (count caps only). A request's own timeout header bounds it too.
    max_queue_wait_s: float | None = field(
        default=None,
        metadata=flag(
            "seconds: refuse (429) a request whose estimated wait for its first token is "
            "longer, and shed one still without it by then (default: --request-timeout, at most "
            "30; 0 = no bound, only the count caps)",
            name="max-queue-wait",
        ),
    )
    requests_per_minute: int | None = field(
        default=None, metadata=flag("per API key (or client) rate limits")
    )
    tokens_per_minute: int | None = field(default=None, metadata=flag("per API key"))

    def __post_init__(self) -> None:
        if self.max_queue_wait_s is not None and self.max_queue_wait_s < 0:
            raise ValueError(f"max_queue_wait_s must be >= 0, got {self.max_queue_wait_s}")
        if self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        per_tenant = self.max_queued_requests_per_tenant
        if per_tenant is not None and per_tenant < 1:
            raise ValueError(f"max_queued_requests_per_tenant must be >= 1, got {per_tenant}")


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    # None: no timeout
    request_timeout_s: float | None = field(
        default=600.0,
        metadata=flag("seconds; 0 = none", name="request-timeout", to_field=_zero_is_none),
    )
    # A client (or a gateway, with what is left of its own deadline) may ask for less, never
    # more, in this header: seconds, a decimal number.
    timeout_header: str = TIMEOUT_HEADER
    # SIGTERM: how long in-flight requests may finish
    drain_timeout_s: float = field(default=30.0, metadata=flag("seconds", name="drain-timeout"))
    max_body_bytes: int = field(default=4 * 1024 * 1024, metadata=flag())

    def __post_init__(self) -> None:
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    default_max_tokens: int | None = field(
        default=None, metadata=flag("None: up to the context length, as vLLM")
    )
    # Defaults for the sampling fields a request leaves out: "auto" the model's own
    # (generation_config.json, a GGUF's general.sampling.*), "vllm" none, or a folder's file;
    # then these fields on top (--override-generation-config).
    generation_config: str = field(
        default="auto",
        metadata=flag(
            "defaults for the sampling fields a request leaves out: auto (the model's "
            "generation_config.json or GGUF sampling keys), vllm (none), or a folder"
        ),
    )
    override_generation_config: dict[str, float] = field(
        default_factory=dict,
        metadata=flag(
            "JSON, e.g. '{\"temperature\": 0.7}': set on top of --generation-config",
            parse=_json_object,
        ),
    )


@dataclass(frozen=True, slots=True)
class ChatConfig:
    chat_template: str | None = field(
        default=None,
        metadata=flag(
            "a Jinja file (or text) to use instead of the model's own chat template",
            to_field=read_chat_template,
        ),
    )
    # tool_choice "auto": read calls from the model's own syntax with this parser (None: the
    # one the chat template teaches); off, "auto" is a 400 as in vLLM.
    enable_auto_tool_choice: bool = field(
        default=False,
        metadata=flag(
            'serve tool_choice "auto" (the default when a request has tools): the model may '
            "answer or call tools, read back from its own syntax"
        ),
    )
    tool_call_parser: str | None = field(
        default=None,
        metadata=flag(
            "that syntax (default: the one the chat template teaches, else hermes, which the "
            "system prompt then teaches)",
            choices=tuple(sorted(PARSERS)),
        ),
    )
    # "qwen3" | "deepseek_r1": thinking read apart
    reasoning_parser: str | None = field(
        default=None,
        metadata=flag(
            "read a reasoning model's <think>...</think> apart from its answer, as the "
            "message's `reasoning` (qwen3: where the thinking is opened; deepseek_r1: from the "
            "start)",
            choices=tuple(sorted(REASONING_PARSERS)),
        ),
    )

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None and self.tool_call_parser not in PARSERS:
            names = ", ".join(sorted(PARSERS))
            raise ValueError(
                f"tool_call_parser must be one of {names}, got {self.tool_call_parser!r}"
            )
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            names = ", ".join(sorted(REASONING_PARSERS))
            raise ValueError(
                f"reasoning_parser must be one of {names}, got {self.reasoning_parser!r}"
            )


@dataclass(frozen=True, slots=True)
class EmbeddingsConfig:
    """/v1/embeddings: a sentence-transformers folder or alias (None: no embedding model), the
    name clients ask for (None: the --embedding-model value), and its dynamic batcher."""

    model: str | None = field(
        default=None,
        metadata=flag(
            "serve /v1/embeddings with this model: all-minilm-l6-v2 or a sentence-transformers "
            "folder (default: none)"
        ),
    )
    model_name: str | None = field(default=None, metadata=flag("defaults to --embedding-model"))
    batcher: BatcherConfig = field(default_factory=BatcherConfig)


@dataclass(frozen=True, slots=True)
class ObservabilityConfig:
    log_requests: bool = field(default=False, metadata=flag())
    tracing: TracingConfig = field(default_factory=TracingConfig)  # OTLP spans; off by default


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = field(default="127.0.0.1", metadata=flag())
    port: int = field(default=8000, metadata=flag())
    served_model_name: str = field(
        default="smollm2-135m", metadata=flag("defaults to --model", default=None)
    )
    # Added to the API process's nice value once the engine process has started (which keeps
    # its own), so that on a box of few cores the engine's threads win the CPU they wait for
    # mid-step. On 2 cores +5 made one stream faster in 29 of 36 rounds, but 64 streams were
    # faster in one series and slower in the next, with later first tokens (BENCHMARKS.md,
    # "Fourth pass"): opt-in. 0 leaves the priority alone.
    api_niceness: int = field(
        default=0,
        metadata=flag(
            "lower the API process's CPU priority by this much once the engine has started "
            "(the engine keeps its own): lower one-stream latency on a box of few cores"
        ),
    )
    # Responses API: how many responses to keep for previous_response_id and GET (an LRU in
    # the API process); 0 stores none.
    responses_store_max: int = field(
        default=1000,
        metadata=flag(
            "Responses API: keep this many responses for previous_response_id and "
            "GET /v1/responses/{id} (least recently used go first; 0: store none)"
        ),
    )
    allow_runtime_lora_updating: bool = field(
        default=False,
        metadata=flag(
            "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (they read the "
            "server's files)"
        ),
    )
    auth: AuthConfig = field(default_factory=AuthConfig, metadata=group("API keys and tenants"))
    admission: AdmissionConfig = field(
        default_factory=AdmissionConfig, metadata=group("admission (queue bounds and rate limits)")
    )
    limits: LimitsConfig = field(
        default_factory=LimitsConfig, metadata=group("timeouts and limits")
    )
    generation: GenerationDefaults = field(
        default_factory=GenerationDefaults, metadata=group("sampling defaults")
    )
    chat: ChatConfig = field(
        default_factory=ChatConfig, metadata=group("chat template and tool calls")
    )
    embeddings: EmbeddingsConfig = field(
        default_factory=EmbeddingsConfig,
        metadata=group(
            "embeddings (/v1/embeddings, Triton-style dynamic batching)", prefix="embedding-"
        ),
    )
    observability: ObservabilityConfig = field(
        default_factory=ObservabilityConfig,
        metadata=group("observability (request log, OpenTelemetry traces)"),
    )
    batch: BatchConfig = field(
        default_factory=BatchConfig,
        metadata=group("Batch API (/v1/files, /v1/batches, run behind real-time traffic)"),
    )

    @property
    def queue_wait_bound_s(self) -> float | None:
        """The wait for a first token past which admission refuses; None: no bound."""
        if self.admission.max_queue_wait_s is not None:
            return self.admission.max_queue_wait_s or None
        if self.limits.request_timeout_s is None:
            return DEFAULT_QUEUE_WAIT_S
        return min(self.limits.request_timeout_s, DEFAULT_QUEUE_WAIT_S)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if not 0 <= self.api_niceness <= 19:
            raise ValueError(f"api_niceness must be in 0..19, got {self.api_niceness}")
