"""The span of one finished generation request, recorded after the fact from its timings.

Named and attributed after OpenTelemetry's GenAI conventions (`chat smollm2-135m`,
`gen_ai.usage.*`), with vLLM's `gen_ai.latency.*` for what those conventions lack. The span is
made at the end, with the request's own start time, so that nothing is paid per token; its
events mark when the engine got the request and when the first token came out.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from surge.observability.tracing import extract, wall_ns

if TYPE_CHECKING:
    from surge.sampling_params import SamplingParams
    from surge.server.generation import RequestTiming
    from surge.server.state import ServerState


class _Choice(Protocol):
    @property
    def finish_reason(self) -> str | None: ...


class SpanJob(Protocol):
    """What a span reads of a finished request (serving.Job), named here so that this module
    need not import the one that calls it."""

    @property
    def state(self) -> ServerState: ...
    @property
    def req_id(self) -> str: ...
    @property
    def params(self) -> SamplingParams: ...
    @property
    def timing(self) -> RequestTiming: ...
    @property
    def tenant(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def choices(self) -> Sequence[_Choice]: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def operation(self) -> str: ...
    @property
    def trace_context(self) -> Context | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def lora_name(self) -> str | None: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_completion_tokens(self) -> int: ...


def record_request_span(job: SpanJob, now_s: float) -> None:
    tracing = job.state.tracing
    if not tracing.enabled:
        return
    t, params = job.timing, job.params
    end_ns = time.time_ns()

    def at(mono_s: float) -> int:
        return wall_ns(mono_s, now_s) if mono_s <= now_s else end_ns

    model = job.lora_name or job.state.config.served_model_name  # what the request named
    attributes: dict[str, str | int | float | bool | list[str]] = {
        "gen_ai.operation.name": job.operation,
        "gen_ai.system": "surge",
        "gen_ai.request.model": model,
        "gen_ai.response.model": model,
        "gen_ai.request.id": job.req_id,
        "gen_ai.request.max_tokens": params.max_tokens or 0,
        "gen_ai.request.temperature": params.temperature,
        "gen_ai.request.top_p": params.top_p,
        "gen_ai.request.choice.count": params.n,
        "gen_ai.usage.input_tokens": job.num_prompt_tokens,
        "gen_ai.usage.output_tokens": job.num_completion_tokens,
        "gen_ai.response.finish_reasons": [c.finish_reason or "abort" for c in job.choices],
        "gen_ai.latency.e2e": now_s - t.arrival_s,
        "gen_ai.latency.time_in_queue": t.queue_s,
        "surge.cached_tokens": t.num_cached_tokens,
        "surge.priority": job.priority,
    }
    if job.tenant:
        attributes["surge.tenant"] = job.tenant
    if params.structured is not None:
        attributes["surge.structured_output"] = params.structured.kind
    if t.first_token_s is not None:
        attributes["gen_ai.latency.time_to_first_token"] = t.first_token_s - t.arrival_s
        if job.num_completion_tokens > 1 and t.last_token_s is not None:
            decode_s = t.last_token_s - t.first_token_s
            attributes["gen_ai.latency.time_per_output_token"] = decode_s / (
                job.num_completion_tokens - 1
            )
    span = tracing.tracer.start_span(
        f"{job.operation} {model}",
        context=job.trace_context,
        kind=SpanKind.SERVER,
        attributes=attributes,
        start_time=at(t.arrival_s),
    )
    if t.queued_s is not None:
        span.add_event("queued", timestamp=at(t.queued_s))
    if t.first_token_s is not None:
        span.add_event("first_token", timestamp=at(t.first_token_s))
    if job.error is not None:
        span.set_status(Status(StatusCode.ERROR, job.error))
        span.set_attribute("error.type", job.error)
    elif job.finish_reason == "abort":
        span.set_attribute("surge.aborted", True)  # the client left: not the server's error
    span.end(end_time=end_ns)


def record_embedding_span(
    state: ServerState,
    headers: Mapping[str, str],
    arrival_s: float,
    model: str,
    num_inputs: int,
    num_tokens: int,
    error: str | None,
) -> None:
    """The span of one /v1/embeddings request (ended now), a child of the caller's trace."""
    if not state.tracing.enabled:
        return
    now_s = time.monotonic()
    attributes: dict[str, str | int | float] = {
        "gen_ai.operation.name": "embeddings",
        "gen_ai.system": "surge",
        "gen_ai.request.model": model,
        "gen_ai.response.model": model,
        "gen_ai.usage.input_tokens": num_tokens,
        "surge.embedding.inputs": num_inputs,
        "gen_ai.latency.e2e": now_s - arrival_s,
    }
    span = state.tracing.tracer.start_span(
        f"embeddings {model}",
        context=extract(headers),
        kind=SpanKind.SERVER,
        attributes=attributes,
        start_time=wall_ns(arrival_s, now_s),
    )
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
        span.set_attribute("error.type", error)
    span.end()
