"""build_app(config) -> FastAPI: the server's OpenAI surface in front of many upstreams.

The lifespan owns the HTTP clients and every background task (health probes, load scrapes,
upstreams-file watcher) and cancels them on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from surge.batch import routes as batch_routes
from surge.gateway.batch_api import open_batch_service
from surge.gateway.config import DegradeAction, GatewayConfig, Policy
from surge.gateway.dashboard import install as install_dashboard
from surge.gateway.degrade import DEGRADED_HEADER, cap_max_tokens, decide
from surge.gateway.dns_watch import discover_once, watch_dns
from surge.gateway.errors import (
    BadRequest,
    GatewayError,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
    Unavailable,
    install_error_handlers,
)
from surge.gateway.health import probe_loop
from surge.gateway.hop_headers import forward_headers
from surge.gateway.limits import LimitExceeded
from surge.gateway.prefix_affinity import route_key
from surge.gateway.probes import probe_router
from surge.gateway.proxy import Proxy, ProxyRequest
from surge.gateway.resume import StreamResume
from surge.gateway.state import GatewayState
from surge.gateway.streaming import RelayStream
from surge.gateway.upstreams import (
    FALLBACK,
    PRIMARY,
    reload_upstreams,
    scrape_loop,
    watch_upstreams_file,
)
from surge.http.deadline import parse_timeout
from surge.http.disconnect import done_before_disconnect
from surge.http.discovery import DnsTarget
from surge.http.request_id import REQUEST_ID_HEADER, RequestIdMiddleware
from surge.http.unicode_check import body_has_lone_surrogate
from surge.observability.tracing import Tracing, extract

log = logging.getLogger(__name__)

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses")


def build_app(config: GatewayConfig) -> FastAPI:
    state = GatewayState.create(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        t = config.timeouts
        timeout = httpx.Timeout(connect=t.connect_s, read=None, write=t.total_s, pool=t.connect_s)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
        async with (
            httpx.AsyncClient(timeout=timeout, limits=limits) as client,
            httpx.AsyncClient(timeout=config.health.timeout_s) as monitor,
        ):
            state.tracing = Tracing.start(config.tracing)
            state.proxy = Proxy(
                config,
                state.pool,
                state.balancers,
                client,
                state.metrics,
                tracing=state.tracing,
                owners=state.owners,
            )
            tasks = await _start_background(state, monitor)
            batch = open_batch_service(state, app)  # /v1/files, /v1/batches (surge/batch)
            try:
                yield
            finally:
                if batch is not None:
                    await batch.close()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                state.tracing.shutdown()

    app = FastAPI(
        title="Surge gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.gateway = state
    install_error_handlers(app)
    install_dashboard(app, state.pool, config.autoscaler_url)  # before the catch-all routes
    app.include_router(batch_routes.router)  # the gateway's own batches, before them too
    app.state.batch = None
    app.add_middleware(RequestIdMiddleware)  # the id goes upstream and back to the client

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        return await _proxy(state, request, "/v1/completions", generation=True)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        return await _proxy(state, request, "/v1/chat/completions", generation=True)

    @app.post("/v1/responses", response_model=None)
    async def responses(request: Request) -> Response:
        return await _proxy(state, request, "/v1/responses", generation=True)

    @app.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"], response_model=None)
    @app.get("/v1/responses/{response_id}/input_items", response_model=None)
    @app.post("/v1/responses/{response_id}/cancel", response_model=None)
    async def stored_response(request: Request, response_id: str) -> Response:
        owner = await _owner(state, request, response_id)
        if owner is None:
            raise NotFound(
                f"Response with id '{response_id}' not found.", code="response_not_found"
            )
        response = await _proxy(
            state, request, "/v1/responses/{id}", generation=False, pinned=owner
        )
        if request.method == "DELETE" and response.status_code == 200:
            state.owners.forget(response_id)
        return response

    @app.get("/health")
    async def health() -> JSONResponse:
        return _health(state)

    app.include_router(probe_router(state))  # /health/live, /health/ready, /health/startup

    @app.get("/metrics")
    async def metrics() -> Response:
        pool, limiter = state.pool, state.limiter
        now_s = time.monotonic()
        state.metrics.refresh(pool.all(), now_s, limiter.in_flight, limiter.num_waiting)
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)

    @app.api_route(
        "/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], response_model=None
    )
    async def passthrough(request: Request, rest: str) -> Response:
        if rest.startswith("models") and request.method == "GET":
            cards = _model_cards(state)
            if cards is not None and rest == "models":
                return JSONResponse({"object": "list", "data": cards})
            if cards is not None and rest.startswith("models/"):
                return _model_card(cards, rest.removeprefix("models/"))
        route = "/v1/models" if rest == "models" else "/v1/other"
        return await _proxy(state, request, route, generation=False)

    @app.api_route("/{name:path}", methods=["GET", "POST"], response_model=None)
    async def server_extras(request: Request, name: str) -> Response:
        if name not in ("tokenize", "detokenize", "version", "score", "rerank", "v2/rerank"):
            raise NotFound(f"Not found: /{name}")
        return await _proxy(state, request, "/other", generation=False)

    return app


async def _start_background(
    state: GatewayState, monitor: httpx.AsyncClient
) -> list[asyncio.Task[None]]:
    config, pool = state.config, state.pool
    tasks = []
    if config.upstreams_file is not None:
        try:
            await reload_upstreams(pool, config.upstreams_file)
        except (OSError, ValueError) as e:
            log.error("cannot read upstreams file %s: %s", config.upstreams_file, e)
        watcher = watch_upstreams_file(
            pool, config.upstreams_file, config.reload_interval_s, state.reload_now
        )
        tasks.append(asyncio.create_task(watcher))
    if config.discover:
        targets = [DnsTarget.parse(t) for t in config.discover]
        try:
            await discover_once(pool, targets)  # serve with the pods there are now
        except OSError as e:  # DNS not answering yet: the watch tries again
            log.error(
                "DNS discovery failed at start (retrying every %gs): %s",
                config.discover_interval_s,
                e,
            )
        tasks.append(asyncio.create_task(watch_dns(pool, targets, config.discover_interval_s)))
    if config.health.interval_s > 0:
        probes = probe_loop(pool.all, monitor, config.health, time.monotonic)
        tasks.append(asyncio.create_task(probes))
    if config.scrape_interval_s > 0:
        scrapes = scrape_loop(pool.all, monitor, config.scrape_interval_s, config.health.timeout_s)
        tasks.append(asyncio.create_task(scrapes))
    if state.kv_index is not None:  # --policy kv_aware: the replicas' KV events
        from surge.gateway.kv_subscriber import KvSubscriber  # zmq: only when asked for

        kv = KvSubscriber(
            pool,
            state.kv_index,
            monitor,
            state.metrics.registry,
            config.kv.tokenizer,
            config.scrape_interval_s or 1.0,
            config.health.timeout_s,
        )
        tasks.append(asyncio.create_task(kv.run()))
    return tasks


def _model_cards(state: GatewayState) -> list[dict[str, Any]] | None:
    """Every model the upstreams in rotation list (base models and LoRA adapters, from their
    /v1/models, scraped), or None when none has said (then one upstream answers)."""
    now_s = time.monotonic()
    known = [u for u in state.pool.all() if u.in_rotation(now_s) and u.models is not None]
    if not known:
        return None
    served: dict[str, int] = {}  # model -> upstreams listing it
    for u in known:
        for name in u.models or ():
            served[name] = served.get(name, 0) + 1
    return [
        {"id": name, "object": "model", "owned_by": "surge", "upstreams": count}
        for name, count in sorted(served.items())
    ]


def _model_card(cards: list[dict[str, Any]], model: str) -> JSONResponse:
    """One card of the fleet's listing (`client.models.retrieve`), or 404."""
    card = next((c for c in cards if c["id"] == model), None)
    if card is None:
        raise NotFound(f"The model `{model}` does not exist.", code="model_not_found")
    return JSONResponse(card)


def _health(state: GatewayState) -> JSONResponse:
    now_s = time.monotonic()
    ups = {
        u.url: {
            "group": u.group,
            "healthy": u.health.is_healthy(now_s),
            "breaker": u.breaker.state(now_s).name.lower(),
            "in_flight": u.in_flight,
        }
        for u in state.pool.all()
    }
    in_rotation = sum(1 for u in state.pool.all() if u.in_rotation(now_s))
    status = "ok" if in_rotation else "unavailable"
    if not ups and state.config.activation_timeout_s > 0:
        status = "scaled_to_zero"  # requests are taken and wait for an upstream to start
    body = {"status": status, "upstreams_in_rotation": in_rotation, "upstreams": ups}
    return JSONResponse(body, status_code=503 if status == "unavailable" else 200)


async def _read_body(request: Request, max_bytes: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise PayloadTooLarge(f"request body over {max_bytes} bytes")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body over {max_bytes} bytes")
        parts.append(part)
    return b"".join(parts)


def _json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None (the upstream will say what is wrong with it)."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if body_has_lone_surrogate(body, parsed):
        return None  # no text to route by (the upstream refuses it with a 400)
    return parsed if isinstance(parsed, dict) else None


async def _owner(state: GatewayState, request: Request, response_id: str) -> str | None:
    """The upstream in rotation holding stored response `response_id` (the client's API key
    owns it there), or None."""
    assert state.proxy is not None
    now_s = time.monotonic()
    serving = [u for u in state.pool.all() if u.in_rotation(now_s)]
    auth = request.headers.get("authorization")
    headers = {"authorization": auth} if auth else {}
    return await state.owners.locate(
        response_id, serving, state.proxy.client, headers, state.config.health.timeout_s
    )


async def _proxy(
    state: GatewayState,
    request: Request,
    route: str,
    *,
    generation: bool,
    pinned: str | None = None,
) -> Response:
    arrival_s = time.perf_counter()
    status = 500
    span = _request_span(state, request, route)
    ends_with_stream = False
    try:
        response = await _admit_and_forward(state, request, arrival_s, generation, span, pinned)
        status = response.status_code
        if isinstance(response, RelayStream):  # the span lasts as long as the stream
            response.add_on_close(span.end)
            ends_with_stream = True
        return response
    except GatewayError as e:
        status = e.status_code
        raise
    finally:
        state.metrics.requests.labels(route, str(status)).inc()
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        if not ends_with_stream:
            span.end()


def _request_span(state: GatewayState, request: Request, route: str) -> trace.Span:
    """The gateway's span of one request, a child of the client's `traceparent` if it sent one."""
    if not state.tracing.enabled:
        return trace.INVALID_SPAN
    return state.tracing.tracer.start_span(
        f"{request.method} {route}",
        context=extract(request.headers),
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": request.method,
            "http.route": route,
            "url.path": request.url.path,
        },
    )


async def _admit_and_forward(
    state: GatewayState,
    request: Request,
    arrival_s: float,
    generation: bool,
    span: trace.Span,
    pinned: str | None,
) -> Response:
    config, metrics, limiter = state.config, state.metrics, state.limiter
    if state.draining:
        raise Unavailable("gateway is shutting down", code="draining", retry_after_s=1.0)
    body = await _read_body(request, config.max_body_bytes)
    timeout_s = _client_timeout(request, config.timeout_header)
    parsed = _json_object(body) if generation else None
    prefix = config.prefix if config.policy is Policy.PREFIX else None
    kv = config.kv if config.policy is Policy.KV_AWARE else None
    key = route_key(parsed, request.headers.get(config.session_header), prefix, kv)
    api_key = request.headers.get("authorization", "")
    waited_from = time.perf_counter()
    try:
        await limiter.acquire(api_key)
    except LimitExceeded as e:
        metrics.shed.labels(e.reason).inc()
        raise TooManyRequests(
            f"gateway busy ({e.reason.replace('_', ' ')})", code=e.reason, retry_after_s=1.0
        ) from None
    queued_s = time.perf_counter() - waited_from
    metrics.queue_wait.observe(queued_s)
    handed_off = False
    try:
        preq = ProxyRequest(
            method=request.method,
            path=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            headers={
                **forward_headers(request.headers, tracing=state.tracing.enabled),
                REQUEST_ID_HEADER: request.state.request_id,  # the client's, or one made here
            },
            body=body,
            key=key,
            stream=bool(parsed and parsed.get("stream") is True),
            arrival_s=arrival_s,
            queued_s=queued_s,
            trace_context=trace.set_span_in_context(span) if state.tracing.enabled else None,
            timeout_s=timeout_s,
            model=model if isinstance(model := (parsed or {}).get("model"), str) else None,
            pinned=pinned,
        )
        if parsed is not None and isinstance(prev := parsed.get("previous_response_id"), str):
            # The next turn of a stored conversation: only its server has the turns before.
            preq.pinned = await _owner(state, request, prev)
        if parsed is not None:
            _degrade(state, preq, parsed)
            if DEGRADED_HEADER in preq.extra_headers:
                span.set_attribute("surge.degraded", preq.extra_headers[DEGRADED_HEADER])
            forwarded = parsed if preq.body is body else _json_object(preq.body)
            preq.resume = StreamResume.plan(request.url.path, forwarded)
        response = await _forward_unless_disconnected(state, preq, request)
        if isinstance(response, RelayStream):
            response.add_on_close(lambda: limiter.release(api_key))
            handed_off = True
        return response
    finally:
        if not handed_off:
            limiter.release(api_key)


def _client_timeout(request: Request, header: str) -> float | None:
    """The deadline the client asks for in `header` (seconds), or None."""
    raw = request.headers.get(header)
    if raw is None:
        return None
    try:
        return parse_timeout(raw, header)
    except ValueError as e:
        raise BadRequest(str(e)) from None


def _degrade(state: GatewayState, preq: ProxyRequest, parsed: dict[str, Any]) -> None:
    """Apply the degradation the current saturation calls for to `preq`, or shed it."""
    config, pool = state.config, state.pool
    now_s = time.monotonic()
    primary = [u.snapshot() for u in pool.candidates(PRIMARY, now_s)]
    fallback = [u.snapshot() for u in pool.candidates(FALLBACK, now_s)]
    if not primary and fallback:  # every primary is out: the fallback group is there for this
        preq.group = FALLBACK
        preq.extra_headers[DEGRADED_HEADER] = "fallback"
        state.metrics.degraded.labels("fallback").inc()
        return
    decision = decide(primary, fallback, config.degrade)
    if decision.action is DegradeAction.NONE:
        return
    assert decision.header is not None
    preq.extra_headers[DEGRADED_HEADER] = decision.header
    state.metrics.degraded.labels(decision.action.value).inc()
    if decision.action is DegradeAction.SHED:
        state.metrics.shed.labels("saturated").inc()
        err_type = TooManyRequests if config.degrade.shed_status == 429 else Unavailable
        raise err_type(
            "every upstream is saturated; retry later",
            code="overloaded",
            retry_after_s=config.degrade.retry_after_s,
            headers=preq.extra_headers,
        )
    if decision.action is DegradeAction.CAP_MAX_TOKENS:
        capped = cap_max_tokens(parsed, config.degrade.max_tokens_cap)
        preq.body = json.dumps(capped).encode()
    elif decision.action is DegradeAction.FALLBACK:
        preq.group = FALLBACK


async def _forward_unless_disconnected(
    state: GatewayState, preq: ProxyRequest, request: Request
) -> Response:
    """Forward, but stop (and so abort the upstream request) if the client leaves first."""
    assert state.proxy is not None
    forward = asyncio.ensure_future(state.proxy.forward(preq))
    if await done_before_disconnect(forward, request):
        return forward.result()
    forward.cancel()
    with contextlib.suppress(asyncio.CancelledError, GatewayError):
        late = await forward
        if isinstance(late, RelayStream):
            await late.close()
    return Response(status_code=499)
