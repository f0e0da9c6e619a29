"""OpenTelemetry traces, exported over OTLP (HTTP/protobuf or gRPC); off unless an endpoint is
given.

One span per request in each process it crosses, joined by W3C `traceparent` headers:

    client ──traceparent──▶ gateway "POST /v1/chat/completions" (SERVER)
                              └ "upstream POST /v1/chat/completions" (CLIENT, one per attempt)
                                  ──traceparent──▶ server "llm_request" (SERVER)

Off, every call is a no-op of the OpenTelemetry API (which FastAPI already depends on); the SDK
and the exporter (`pip install 'surge[tracing]'`) are imported only when tracing is switched on.
Each process keeps its own tracer provider instead of the global one, so tests and embedders can
run a gateway and a server in one process without their spans mixing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from surge.config.flags import flag
from surge.config.settings import settings

log = logging.getLogger(__name__)

TRACE_HEADERS = ("traceparent", "tracestate")
OTLP_TRACES_PATH = "/v1/traces"
PROTOCOLS = ("http/protobuf", "grpc")  # OTEL_EXPORTER_OTLP_PROTOCOL's values we speak
_PROPAGATOR = TraceContextTextMapPropagator()


def endpoint_from_env() -> str | None:
    """The default for `--otlp-traces-endpoint`: OpenTelemetry's own variables."""
    return settings().otlp_traces_endpoint


def protocol_from_env() -> str:
    """The default for `--otlp-traces-protocol`: OpenTelemetry's variables, else HTTP."""
    return settings().otlp_traces_protocol or "http/protobuf"


@dataclass(frozen=True, slots=True)
class TracingConfig:
    # The collector: over HTTP a base URL gets OTLP's /v1/traces appended; over gRPC it is the
    # server's address (http:// without TLS, https:// with). None: tracing off.
    otlp_endpoint: str | None = field(
        default=None,
        metadata=flag(
            "send OpenTelemetry spans over OTLP to this collector, e.g. "
            "http://127.0.0.1:4318 (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else off)",
            name="otlp-traces-endpoint",
            default=endpoint_from_env,
        ),
    )
    service_name: str = "surge"  # OTEL_SERVICE_NAME overrides it, as OpenTelemetry's SDKs do
    instance_id: str = ""  # service.instance.id: which replica (host:port) made the span
    # or "grpc" (collectors listen on 4318 and 4317)
    otlp_protocol: str = field(
        default="http/protobuf",
        metadata=flag(
            "http/protobuf (a collector's port 4318) or grpc (4317) "
            "(default: $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else http/protobuf)",
            name="otlp-traces-protocol",
            choices=PROTOCOLS,
            default=protocol_from_env,
        ),
    )

    def __post_init__(self) -> None:
        if self.otlp_protocol not in PROTOCOLS:
            raise ValueError(
                f"otlp protocol must be one of {', '.join(PROTOCOLS)}, got {self.otlp_protocol!r}"
            )
        if self.otlp_endpoint is not None:
            parts = urlsplit(self.otlp_endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"otlp endpoint must be an http(s) URL, got {self.otlp_endpoint!r}"
                )

    @property
    def traces_url(self) -> str | None:
        if self.otlp_endpoint is None:
            return None
        parts = urlsplit(self.otlp_endpoint)
        if parts.path in ("", "/") and self.otlp_protocol != "grpc":
            return self.otlp_endpoint.rstrip("/") + OTLP_TRACES_PATH
        return self.otlp_endpoint


class Tracing:
    """A tracer and what it takes to continue and pass on a trace; `Tracing.off()` does nothing."""

    def __init__(self, tracer: trace.Tracer, provider: object | None = None) -> None:
        self.tracer = tracer
        self._provider = provider  # the SDK's TracerProvider, flushed on shutdown

    @classmethod
    def off(cls) -> Tracing:
        return cls(trace.NoOpTracer())

    @classmethod
    def start(cls, config: TracingConfig) -> Tracing:
        """Export spans to `config.otlp_endpoint` in batches, in a background thread."""
        url = config.traces_url
        if url is None:
            return cls.off()
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as e:
            raise RuntimeError(
                "tracing needs the OpenTelemetry SDK and OTLP exporter: "
                "pip install 'surge[tracing]'"
            ) from e
        attributes = {"service.name": settings().otel_service_name or config.service_name}
        if config.instance_id:
            attributes["service.instance.id"] = config.instance_id
        # The sampler comes from OTEL_TRACES_SAMPLER(_ARG), default parent-based always-on;
        # batching from OTEL_BSP_* (a span leaves within 5 s by default).
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(_exporter(config.otlp_protocol, url)))
        log.info(
            "tracing: OTLP (%s) spans to %s as %s",
            config.otlp_protocol,
            url,
            attributes["service.name"],
        )
        return cls(provider.get_tracer("surge"), provider)

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    def shutdown(self) -> None:
        """Send what is still batched; call once, on the way out."""
        if self._provider is not None:
            self._provider.shutdown()  # type: ignore[attr-defined]
            self._provider = None


def _exporter(protocol: str, url: str) -> Any:
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )

            return GrpcExporter(endpoint=url, insecure=urlsplit(url).scheme == "http")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=url)
    except ImportError as e:
        raise RuntimeError(
            f"tracing over OTLP {protocol} needs its exporter: pip install 'surge[tracing]'"
        ) from e


def extract(headers: Mapping[str, str]) -> Context:
    """The caller's trace (its `traceparent`), or an empty context that starts a new one."""
    return _PROPAGATOR.extract(carrier=headers)


def inject(span: trace.Span) -> dict[str, str]:
    """Headers that make the receiver's spans children of `span` (none for a no-op span)."""
    carrier: dict[str, str] = {}
    if span.get_span_context().is_valid:
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def wall_ns(monotonic_s: float, now_monotonic_s: float | None = None) -> int:
    """A `time.monotonic()` reading as the epoch nanoseconds spans are stamped in."""
    now_m = time.monotonic() if now_monotonic_s is None else now_monotonic_s
    return time.time_ns() - round((now_m - monotonic_s) * 1e9)
