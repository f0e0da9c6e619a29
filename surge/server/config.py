"""ServerConfig: the HTTP side's knobs, built once from the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field

from surge.batching.config import BatcherConfig
from surge.deadline import TIMEOUT_HEADER
from surge.observability.tracing import TracingConfig
from surge.server.reasoning import PARSERS as REASONING_PARSERS
from surge.server.tool_parsers import PARSERS

DEFAULT_QUEUE_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str = "smollm2-135m"
    api_keys: frozenset[str] = field(default_factory=frozenset)  # empty: no auth
    max_queued_requests: int = 1024  # waiting in the engine + accepted not yet seen by it
    max_queued_tokens: int | None = None  # prompt tokens waiting; None: no token bound
    max_queued_requests_per_tenant: int | None = None  # None: only the shared bound
    # Who a request is for (fair share, per-tenant limits and metrics), first match wins:
    # this header (a gateway sets it), the body's `user`, the API key (hashed), else "".
    tenant_header: str = "x-surge-tenant"
    priority_header: str = "x-surge-priority"  # used when the body has no `priority`
    requests_per_minute: int | None = None  # per API key (or client) rate limits
    tokens_per_minute: int | None = None
    request_timeout_s: float | None = 600.0  # None: no timeout
    # Refuse (429) a request whose estimated wait for its first token is longer (queue_wait.py),
    # and shed one admitted that still has none by then. None: the request timeout, at most
    # DEFAULT_QUEUE_WAIT_S (a request that would time out before its first token is refused at
    # once rather than after its timeout; 30 s is a twentieth of the default 600 s timeout);
    # 0: no bound (count caps only). A request's own timeout header bounds it too.
    max_queue_wait_s: float | None = None
    # A client (or a gateway, with what is left of its own deadline) may ask for less, never
    # more, in this header: seconds, a decimal number.
    timeout_header: str = TIMEOUT_HEADER
    drain_timeout_s: float = 30.0  # SIGTERM: how long in-flight requests may finish
    max_body_bytes: int = 4 * 1024 * 1024
    default_max_tokens: int | None = None  # None: up to the context length, as vLLM
    # Defaults for the sampling fields a request leaves out: "auto" the model's own
    # (generation_config.json, a GGUF's general.sampling.*), "vllm" none, or a folder's file;
    # then these fields on top (--override-generation-config).
    generation_config: str = "auto"
    override_generation_config: dict[str, float] = field(default_factory=dict)
    log_requests: bool = False
    # Added to the API process's nice value once the engine process has started (which keeps
    # its own), so that on a box of few cores the engine's threads win the CPU they wait for
    # mid-step. On 2 cores +5 made one stream faster in 29 of 36 rounds, but 64 streams were
    # faster in one series and slower in the next, with later first tokens (BENCHMARKS.md,
    # "Fourth pass"): opt-in. 0 leaves the priority alone.
    api_niceness: int = 0
    # /v1/embeddings: a sentence-transformers folder or alias (None: no embedding model), the
    # name clients ask for (None: the --embedding-model value), and its dynamic batcher.
    embedding_model: str | None = None
    embedding_model_name: str | None = None
    embedding_batcher: BatcherConfig = field(default_factory=BatcherConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)  # OTLP spans; off by default
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter (they read the server's files).
    allow_runtime_lora_updating: bool = False
    # tool_choice "auto": read calls from the model's own syntax with this parser (None: the
    # one the chat template teaches); off, "auto" is a 400 as in vLLM.
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    chat_template: str | None = None  # Jinja text replacing the model's own
    reasoning_parser: str | None = None  # "qwen3" | "deepseek_r1": thinking read apart
    # Responses API: how many responses to keep for previous_response_id and GET (an LRU in
    # the API process); 0 stores none.
    responses_store_max: int = 1000

    @property
    def queue_wait_bound_s(self) -> float | None:
        """The wait for a first token past which admission refuses; None: no bound."""
        if self.max_queue_wait_s is not None:
            return self.max_queue_wait_s or None
        if self.request_timeout_s is None:
            return DEFAULT_QUEUE_WAIT_S
        return min(self.request_timeout_s, DEFAULT_QUEUE_WAIT_S)

    def __post_init__(self) -> None:
        if self.max_queue_wait_s is not None and self.max_queue_wait_s < 0:
            raise ValueError(f"max_queue_wait_s must be >= 0, got {self.max_queue_wait_s}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")
        per_tenant = self.max_queued_requests_per_tenant
        if per_tenant is not None and per_tenant < 1:
            raise ValueError(f"max_queued_requests_per_tenant must be >= 1, got {per_tenant}")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if not 0 <= self.api_niceness <= 19:
            raise ValueError(f"api_niceness must be in 0..19, got {self.api_niceness}")
        if self.tool_call_parser is not None and self.tool_call_parser not in PARSERS:
            names = ", ".join(sorted(PARSERS))
            raise ValueError(f"tool_call_parser must be one of {names}, got "
                             f"{self.tool_call_parser!r}")  # fmt: skip
        if self.responses_store_max < 0:
            raise ValueError(f"responses_store_max must be >= 0, got {self.responses_store_max}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            names = ", ".join(sorted(REASONING_PARSERS))
            raise ValueError(f"reasoning_parser must be one of {names}, got "
                             f"{self.reasoning_parser!r}")  # fmt: skip
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
