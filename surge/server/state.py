"""What every route needs, held once per app: the engine client, limits, metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fastapi import Request

from surge.engine.client.client import AsyncEngineClient
from surge.http.deadline import parse_timeout
from surge.models.formats.tokenizer import Tokenizer
from surge.observability.metrics import ServerMetrics
from surge.observability.queue_wait_metrics import QueueWaitMetrics
from surge.observability.tracing import Tracing
from surge.server.admission import Admission, AdmissionController
from surge.server.config import ServerConfig
from surge.server.embeddings import EmbeddingService
from surge.server.errors import BadRequestError, NotFoundError, RateLimitError, SurgeHTTPError
from surge.server.event_log import EventLogs
from surge.server.queue_wait import Work
from surge.server.rate_limit import RateLimiter
from surge.server.reasoning import PARSERS as REASONING_PARSERS
from surge.server.reasoning import ReasoningParser
from surge.server.response_store import ResponseStore
from surge.server.tool_parsers import PARSERS, ToolParser, parser_for_template
from surge.server.tool_parsers.prompt import renders_tools

BATCH_LINES_QUEUED = 1024  # batch-line requests admitted without a first token, at most


@dataclass
class ServerState:
    config: ServerConfig
    client: AsyncEngineClient
    metrics: ServerMetrics
    admission: AdmissionController
    limiter: RateLimiter
    started_s: float
    embeddings: EmbeddingService | None = None
    tracing: Tracing = field(default_factory=Tracing.off)
    tool_parser: type[ToolParser] | None = None  # None: tool_choice "auto" is refused
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(0))
    reasoning: ReasoningParser | None = None  # --reasoning-parser
    background: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # by response id
    streams: EventLogs = field(default_factory=EventLogs)  # streamed background responses' events
    # The model's recommended sampling for fields a request leaves out (generation_config.py).
    sampling_defaults: dict[str, float] = field(default_factory=dict)
    queue_wait: QueueWaitMetrics | None = None  # admission's wait estimates against the waits
    # Batch lines (surge/batch): a pool of their own, so that the interactive bounds and the
    # wait estimate count interactive requests only.
    batch_admission: AdmissionController = field(
        default_factory=lambda: AdmissionController(BATCH_LINES_QUEUED)
    )

    @classmethod
    def create(
        cls,
        config: ServerConfig,
        client: AsyncEngineClient,
        metrics: ServerMetrics,
        embeddings: EmbeddingService | None = None,
        tracing: Tracing | None = None,
    ) -> ServerState:
        return cls(
            config=config,
            client=client,
            metrics=metrics,
            admission=AdmissionController(
                config.admission.max_queued_requests,
                config.admission.max_queued_tokens,
                max_queued_per_tenant=config.admission.max_queued_requests_per_tenant,
            ),
            limiter=RateLimiter(
                config.admission.requests_per_minute, config.admission.tokens_per_minute
            ),
            started_s=time.monotonic(),
            embeddings=embeddings,
            tracing=tracing or Tracing.off(),
            tool_parser=_tool_parser(config, client.tokenizer.chat_template),
            responses=ResponseStore(config.responses_store_max),
            reasoning=REASONING_PARSERS.get(config.chat.reasoning_parser or ""),
            queue_wait=QueueWaitMetrics(metrics.model_name, metrics.registry),
        )

    @property
    def default_max_tokens(self) -> int | None:
        """--default-max-tokens, else the model's max_new_tokens, else None (the context)."""
        if self.config.generation.default_max_tokens is not None:
            return self.config.generation.default_max_tokens
        found = self.sampling_defaults.get("max_tokens")
        return None if found is None else int(found)

    @property
    def template_renders_tools(self) -> bool:
        return renders_tools(self.tokenizer.chat_template)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.client.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.client.max_model_len

    def is_base_model(self, name: str) -> bool:
        return name in (self.config.served_model_name, self.model_path)

    def check_model(self, name: str | None) -> str | None:
        """404 unless `name` is the served model or a loaded LoRA adapter; the adapter's name,
        or None for the base model."""
        if name is None or self.is_base_model(name):
            return None
        if name in self.client.lora_adapters:
            return name
        raise NotFoundError.model_not_found(name)

    @property
    def model_path(self) -> str:
        return self.client.info.model_path

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet answered, embedding inputs included (0: drained)."""
        embedding = self.embeddings.in_flight if self.embeddings is not None else 0
        return self.admission.in_flight + embedding

    def admit(
        self,
        key: str,
        num_prompt_tokens: int,
        reserve_tokens: int,
        tenant: str = "",
        *,
        work: Work | None = None,
        max_wait_s: float | None = None,
        arrival_s: float | None = None,
    ) -> Admission:
        """Rate limits per key, then the queue bounds and the wait estimate against
        `max_wait_s`; raises 429/503 with Retry-After."""
        self.metrics.observe_received()
        self.admission.last_estimate_s = None
        try:
            self._check_rate(key, num_prompt_tokens + reserve_tokens)
            # The server's own count of admitted requests without a first token is exact and
            # current; the engine's waiting gauge lags by a step and is a subset of it.
            ticket = self.admission.admit(
                num_prompt_tokens,
                tenant=tenant,
                work=work,
                max_wait_s=max_wait_s,
                step_cost=self.client.step_cost.seconds if self.client.step_cost.ready else None,
            )
        except SurgeHTTPError as e:
            self.metrics.observe_rejection(str(e.code or e.type))
            if self.queue_wait is not None:
                if arrival_s is not None:
                    self.queue_wait.observe_refusal(time.monotonic() - arrival_s)
                if self.admission.last_estimate_s is not None:
                    self.queue_wait.observe_estimate(self.admission.last_estimate_s, False)
            raise
        if self.queue_wait is not None and ticket.estimate_s is not None:
            self.queue_wait.observe_estimate(ticket.estimate_s, True)
        return ticket

    def check_embedding_request(self, key: str, num_tokens: int) -> None:
        """What an embedding request passes besides its own queue: open, within rate limits."""
        try:
            self.admission.check_open()
            self._check_rate(key, num_tokens)
        except SurgeHTTPError as e:
            self.metrics.observe_rejection(str(e.code or e.type))
            raise

    def check_rate(self, key: str, num_tokens: int) -> None:
        """The per-key rate limits alone (a batch line's admission; 429 with Retry-After)."""
        try:
            self._check_rate(key, num_tokens)
        except SurgeHTTPError as e:
            self.metrics.observe_rejection(str(e.code or e.type))
            raise

    def _check_rate(self, key: str, num_tokens: int) -> None:
        wait = self.limiter.check(key, num_tokens, time.monotonic())
        if wait > 0:
            raise RateLimitError(
                f"rate limit exceeded for this tenant or API key; retry in {wait:.1f}s",
                retry_after_s=wait,
                code="rate_limit_exceeded",
            )


def _tool_parser(config: ServerConfig, template: str | None) -> type[ToolParser] | None:
    if not config.chat.enable_auto_tool_choice:
        return None
    if config.chat.tool_call_parser is not None:
        return PARSERS[config.chat.tool_call_parser]
    return parser_for_template(template)


def request_timeout_s(request: Request, config: ServerConfig) -> float | None:
    """The server's request timeout, or the shorter one the request's timeout header asks for
    (400 for a header that is not a positive number of seconds)."""
    raw = request.headers.get(config.limits.timeout_header)
    if raw is None:
        return config.limits.request_timeout_s
    try:
        asked = parse_timeout(raw, config.limits.timeout_header)
    except ValueError as e:
        raise BadRequestError(str(e), param=config.limits.timeout_header) from None
    limit = config.limits.request_timeout_s
    return asked if limit is None else min(asked, limit)


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.surge
    return state


def client_key(request: Request) -> str:
    """Rate-limit key: the API key when one is sent, else the client address."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return "key:" + auth[7:].strip()
    host = request.client.host if request.client else "unknown"
    return "ip:" + host
