"""Forward one request: pick an upstream, send, retry elsewhere until a byte reaches the client.

NOTE: one request's path

    record_request(budget)
    loop (at most retry.max_attempts):
        choose: candidates in rotation, not tried yet (un-throttled first) -> balancer.pick
                -> breaker.allow (a permit; every permit ends in record or cancel)
        send, wait for the head (and a stream's first chunk) under the phase timeouts
        success              -> answer (a stream is relayed from here on, never retried; a
                                text stream that breaks goes on elsewhere: _resume)
        4xx other than 429   -> answer: the request's fault, the upstream is fine
        429/503 (refused)    -> remember Retry-After; retry elsewhere, the breaker unmoved
        5xx, connect error,  -> failure: breaker, passive health; retry elsewhere
        timeout, broken head
        a retry needs budget, a candidate left, time before the deadline, and a jittered backoff
    nothing left: all refused -> their 429/503 with the smallest Retry-After; else the last
    upstream error, or 502/504 from the gateway; no candidate at all -> 503 + Retry-After
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.responses import Response

from surge.gateway.balancers import Balancer
from surge.gateway.breaker import Outcome, Permit, classify_status
from surge.gateway.config import GatewayConfig
from surge.gateway.errors import (
    BadGateway,
    GatewayError,
    GatewayTimeout,
    NotFound,
    TooManyRequests,
    Unavailable,
)
from surge.gateway.hop_headers import UPSTREAM_HEADER, response_headers
from surge.gateway.metrics import GatewayMetrics
from surge.gateway.response_owners import ResponseOwners
from surge.gateway.resume import StreamResume
from surge.gateway.retry import RetryBudget, backoff_s, parse_retry_after, retry_after_header
from surge.gateway.streaming import RelayStream
from surge.gateway.upstreams import PRIMARY, RouteKey, Upstream, UpstreamPool
from surge.http.headers import RESPONSE_ID_HEADER
from surge.observability.tracing import Tracing, inject

log = logging.getLogger(__name__)

MAX_THROTTLE_S = 60.0  # never park an upstream longer than this on its own Retry-After


@dataclass(slots=True)
class ProxyRequest:
    method: str
    path: str  # with the query string
    headers: dict[str, str]
    body: bytes
    key: RouteKey
    stream: bool  # the client asked for SSE: the first-byte timeout covers the first chunk
    group: str = PRIMARY
    extra_headers: dict[str, str] = field(default_factory=dict)  # added to the answer
    arrival_s: float = 0.0  # perf_counter() when the gateway got it (overhead metric)
    queued_s: float = 0.0  # time spent waiting for a concurrency slot
    trace_context: Context | None = None  # the gateway's span of this request, when tracing
    timeout_s: float | None = None  # the client's deadline, when shorter than total_s
    model: str | None = None  # the body's `model`: only upstreams that list it (or say nothing)
    pinned: str | None = None  # only this upstream (it holds the stored response named)
    resume: StreamResume | None = None  # a text stream that may go on elsewhere if it breaks


@dataclass(slots=True)
class _Attempt:
    outcome: Outcome
    response: Response | None = None  # the upstream's answer (final, or kept as a last resort)
    error: GatewayError | None = None  # the gateway's own error for a failure without answer
    kind: str = ""
    retry_after_s: float | None = None


class Lease:
    """One attempt's hold on an upstream (in-flight count, breaker permit) and its span,
    released once."""

    def __init__(self, proxy: Proxy, up: Upstream, permit: Permit, span: trace.Span) -> None:
        self._proxy, self.up, self._permit, self.span = proxy, up, permit, span
        self.start_s = proxy.clock()
        self._done = False
        up.in_flight += 1

    def finish(self, outcome: Outcome | None, kind: str = "") -> None:
        if self._done:
            return
        self._done = True
        up, now_s, m = self.up, self._proxy.clock(), self._proxy.metrics
        up.in_flight -= 1
        if outcome is Outcome.SUCCESS or outcome is Outcome.FAILURE:
            ok = outcome is Outcome.SUCCESS
            was = (up.breaker.state(now_s), up.health.healthy)
            up.breaker.record(self._permit, ok, now_s)
            up.health.on_traffic(ok, now_s)
            if was != (up.breaker.state(now_s), up.health.healthy):
                log.warning(
                    "upstream %s: breaker %s, %s (after %s)",
                    up.url,
                    up.breaker.state(now_s).name.lower(),
                    "healthy" if up.health.healthy else "out of rotation (outlier)",
                    kind or outcome.value,
                )
        else:
            up.breaker.cancel(self._permit)
        if kind:
            m.upstream_errors.labels(up.url, kind).inc()
        m.upstream_requests.labels(up.url, outcome or "cancelled").inc()
        m.upstream_latency.labels(up.url, "total").observe(now_s - self.start_s)
        self.span.set_attribute("surge.outcome", outcome or "cancelled")
        if kind:
            self.span.set_attribute("error.type", kind)
            if outcome is Outcome.FAILURE:
                self.span.set_status(Status(StatusCode.ERROR, kind))
        self.span.end()


class Proxy:
    def __init__(
        self,
        config: GatewayConfig,
        pool: UpstreamPool,
        balancers: Mapping[str, Balancer],
        client: httpx.AsyncClient,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
        tracing: Tracing | None = None,
        owners: ResponseOwners | None = None,
    ) -> None:
        self.config = config
        self.owners = owners or ResponseOwners()  # learned from the answers' header
        self.tracing = tracing or Tracing.off()
        self.pool = pool
        self.balancers = balancers
        self.client = client
        self.metrics = metrics
        self.clock = clock
        self.budget = RetryBudget.from_config(config.retry)
        self._rng = random.Random(config.seed)

    async def forward(self, req: ProxyRequest) -> Response:
        """The answer for `req`; raises GatewayError when the gateway answers itself."""
        retry = self.config.retry
        total_s = self.config.timeouts.total_s
        if req.timeout_s is not None:
            total_s = min(total_s, req.timeout_s)
        deadline_s = self.clock() + total_s
        if self.config.activation_timeout_s > 0 and not self.pool.group(req.group):
            await self._await_upstream(req.group, deadline_s)
        self.budget.record_request(self.clock())
        tried: list[str] = []
        attempts: list[_Attempt] = []
        while True:
            chosen = self._choose(req, tried)
            if chosen is None:
                break
            up, permit, wait_s = chosen
            tried.append(up.url)
            if wait_s > 0:  # it asked for a pause (Retry-After) and nothing else is free
                await asyncio.sleep(wait_s)
            result = await self._attempt(up, permit, req, deadline_s, first=not attempts)
            if isinstance(result, Response):
                return result
            attempts.append(result)
            if not self._may_retry(req, result, tried, deadline_s, len(attempts)):
                break
            await asyncio.sleep(backoff_s(len(attempts) - 1, retry, self._rng))
        return self._give_up(req, attempts)

    async def _await_upstream(self, group: str, deadline_s: float) -> None:
        """Scaled to zero: wait (counted, so that an autoscaler sees the demand) until an
        upstream of `group` is in rotation, or the activation timeout or the deadline passes."""
        until_s = min(self.clock() + self.config.activation_timeout_s, deadline_s)
        gauge = self.metrics.awaiting_upstream
        gauge.inc()
        try:
            while not self.pool.candidates(group, self.clock()) and self.clock() < until_s:
                await asyncio.sleep(0.1)
        finally:
            gauge.dec()

    def _may_retry(
        self, req: ProxyRequest, last: _Attempt, tried: list[str], deadline_s: float, num: int
    ) -> bool:
        now_s = self.clock()
        denied = None
        if num >= self.config.retry.max_attempts:
            denied = "attempts"
        elif now_s >= deadline_s:
            denied = "deadline"
        elif not self._candidates(req, now_s, tried):
            denied = "no_upstream"
        elif not self.budget.can_retry(now_s):
            denied = "budget"
        if denied is not None:
            self.metrics.retries_denied.labels(denied).inc()
            return False
        self.budget.record_retry(now_s)
        self.metrics.retries.labels(last.kind or last.outcome.value).inc()
        return True

    def _choose(self, req: ProxyRequest, tried: list[str]) -> tuple[Upstream, Permit, float] | None:
        """(upstream, permit, seconds to wait first) or None when no candidate is left."""
        now_s = self.clock()
        candidates = self._candidates(req, now_s, tried)
        fresh = [u for u in candidates if not u.throttled(now_s)]
        if not fresh:  # all asked for a pause: those whose pause ends soon enough to wait out
            fresh = [
                u
                for u in candidates
                if u.throttled_until_s - now_s <= self.config.retry.max_retry_after_s
            ]
        balancer = self.balancers[req.group]
        while fresh:
            url = balancer.pick([u.snapshot() for u in fresh], req.key)
            up = next((u for u in fresh if u.url == url), None)
            if up is None:
                return None
            permit = up.breaker.allow(now_s)
            if permit is not None:
                return up, permit, max(0.0, up.throttled_until_s - now_s)
            fresh.remove(up)
        return None

    def _candidates(self, req: ProxyRequest, now_s: float, tried: list[str]) -> list[Upstream]:
        if req.pinned is not None:
            pinned = [u for u in self.pool.all() if u.url == req.pinned]
            return [u for u in pinned if u.url not in tried and u.in_rotation(now_s)]
        return self.pool.candidates(req.group, now_s, tried, req.model)

    async def _attempt(
        self, up: Upstream, permit: Permit, req: ProxyRequest, deadline_s: float, first: bool
    ) -> Response | _Attempt:
        timeouts = self.config.timeouts
        lease = Lease(self, up, permit, self._attempt_span(up, req, first))
        # The upstream learns the time left, so that it gives up (and frees the batch slot) when
        # no one will wait for the answer any more.
        left_s = max(0.001, deadline_s - self.clock())
        headers = {**req.headers, self.config.timeout_header: f"{left_s:.3f}"}
        if self.tracing.enabled:
            headers.update(inject(lease.span))
        request = self.client.build_request(
            req.method, up.url + req.path, headers=headers, content=req.body
        )
        head_s = deadline_s - self.clock()
        if req.stream:
            head_s = min(head_s, timeouts.first_byte_s)
        sent_s = time.perf_counter()
        resp: httpx.Response | None = None
        try:
            async with asyncio.timeout(max(head_s, 0.0)):
                resp = await self.client.send(request, stream=True)
                outcome = classify_status(resp.status_code)
                if outcome is Outcome.SUCCESS and _is_event_stream(resp):
                    chunks = resp.aiter_bytes()
                    first_chunk = await anext(chunks, b"")
                    if not first_chunk:
                        raise httpx.RemoteProtocolError("empty event stream")
                else:
                    body = await resp.aread()
        except BaseException as e:
            if resp is not None:
                await resp.aclose()
            if isinstance(e, TimeoutError):
                kind = "first_byte_timeout" if req.stream else "timeout"
                lease.finish(Outcome.FAILURE, kind)
                err: GatewayError = GatewayTimeout(f"upstream timed out ({kind})", code=kind)
                return _Attempt(Outcome.FAILURE, error=err, kind=kind)
            if isinstance(e, Exception):
                # httpx's errors, and what its transport lets through unwrapped: anyio raised
                # AttributeError on the socket of an upstream killed mid-connect (a 500 in the
                # kill -9 test). Either way the upstream failed: retry elsewhere.
                if not isinstance(e, httpx.HTTPError):
                    log.warning("upstream %s: transport error %r", up.url, e)
                kind = (
                    "connect"
                    if isinstance(e, httpx.ConnectError | httpx.TimeoutException)
                    else "protocol"
                )
                lease.finish(Outcome.FAILURE, kind)
                err = BadGateway(f"upstream failed: {e!r}", code=f"upstream_{kind}_error")
                return _Attempt(Outcome.FAILURE, error=err, kind=kind)
            lease.finish(None)  # cancelled: the client went away
            raise
        ready_s = time.perf_counter()
        lease.span.set_attribute("http.response.status_code", resp.status_code)
        m = self.metrics
        m.upstream_latency.labels(up.url, "first_byte").observe(ready_s - sent_s)
        headers = self._response_headers(resp, up, req)
        if outcome is Outcome.SUCCESS and (response_id := resp.headers.get(RESPONSE_ID_HEADER)):
            self.owners.learn(response_id, up.url)
        if outcome is Outcome.SUCCESS and _is_event_stream(resp):
            resumer = None
            if req.resume is not None and self.config.retry.resume_streams:
                resumer = functools.partial(self._resume, req, up.url, deadline_s)
            stream = RelayStream(
                resp,
                chunks,
                first_chunk,
                lease,
                idle_s=timeouts.idle_s,
                deadline_s=deadline_s,
                clock=self.clock,
                headers=headers,
                tracker=req.resume,
                resumer=resumer,
            )
            self._observe_overhead(req, first, sent_s, ready_s)
            return stream
        response = Response(body, status_code=resp.status_code, headers=headers)
        if outcome is Outcome.SUCCESS and _model_not_found(resp.status_code, body, req.model):
            # Its list was stale (a LoRA adapter unloaded since the last scrape): forget the
            # model there and try an upstream that still lists it; the upstream is fine.
            lease.finish(outcome)
            if up.models is not None and req.model is not None:
                up.models = up.models - {req.model}
            return _Attempt(outcome, response=response, kind="model_not_found")
        if outcome is Outcome.SUCCESS:
            lease.finish(outcome)
            self._observe_overhead(req, first, sent_s, ready_s)
            return response
        kind = f"http_{resp.status_code}" if outcome is Outcome.FAILURE else ""
        lease.finish(outcome, kind)
        retry_after_s = parse_retry_after(resp.headers.get("retry-after"))
        if outcome is Outcome.REFUSED and retry_after_s is not None:
            up.throttled_until_s = self.clock() + min(retry_after_s, MAX_THROTTLE_S)
        return _Attempt(
            outcome,
            response=response,
            kind=kind or f"http_{resp.status_code}",
            retry_after_s=retry_after_s,
        )

    async def _resume(
        self, req: ProxyRequest, broken: str, deadline_s: float, tracker: StreamResume
    ) -> RelayStream | bytes | None:
        """The rest of a broken text stream from another upstream (resume.py), the final events
        if its token limit was reached, or None when no upstream takes it."""
        tried = [broken]
        while self.clock() < deadline_s and (chosen := self._choose(req, tried)) is not None:
            up, permit, _ = chosen
            tried.append(up.url)
            sent = await self._count_tokens(up, req, tracker.text)
            if sent is None:
                up.breaker.cancel(permit)
                continue
            body = tracker.continuation(sent)
            if body is None:
                up.breaker.cancel(permit)
                self.metrics.stream_resumes.labels("at_limit").inc()
                return tracker.final_events()
            again = dataclasses.replace(req, body=body, resume=None)
            result = await self._attempt(up, permit, again, deadline_s, first=False)
            if isinstance(result, RelayStream):
                log.warning("stream from %s broke mid-answer: continued on %s", broken, up.url)
                self.metrics.stream_resumes.labels("resumed").inc()
                return result
            if isinstance(result, Response):
                break  # answered, not with a stream (a 4xx): no other upstream would differ
        self.metrics.stream_resumes.labels("failed").inc()
        return None

    async def _count_tokens(self, up: Upstream, req: ProxyRequest, text: str) -> int | None:
        """How many tokens `text` is for `up`'s model (its /tokenize), None if it cannot say."""
        if not text:
            return 0
        body = {"prompt": text, "add_special_tokens": False}
        if req.model is not None:
            body["model"] = req.model
        headers = {k: v for k, v in req.headers.items() if k.lower() == "authorization"}
        try:
            answer = await self.client.post(
                up.url + "/tokenize",
                json=body,
                headers=headers,
                timeout=self.config.health.timeout_s,
            )
            return int(answer.json()["count"]) if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def _attempt_span(self, up: Upstream, req: ProxyRequest, first: bool) -> trace.Span:
        if not self.tracing.enabled:
            return trace.INVALID_SPAN
        path = req.path.split("?", 1)[0]
        return self.tracing.tracer.start_span(
            f"upstream {req.method} {path}",
            context=req.trace_context,
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": req.method,
                "url.full": up.url + req.path,
                "surge.upstream": up.url,
                "surge.upstream.group": up.group,
                "surge.retry": not first,
            },
        )

    def _response_headers(
        self, resp: httpx.Response, up: Upstream, req: ProxyRequest
    ) -> dict[str, str]:
        headers = response_headers(resp.headers)
        headers[UPSTREAM_HEADER] = up.url
        headers.update(req.extra_headers)
        return headers

    def _observe_overhead(
        self, req: ProxyRequest, first: bool, sent_s: float, ready_s: float
    ) -> None:
        if first and req.arrival_s:  # a retried request's time is mostly the failed attempts'
            before = sent_s - req.arrival_s - req.queued_s
            self.metrics.overhead.observe(before + time.perf_counter() - ready_s)

    def _give_up(self, req: ProxyRequest, attempts: list[_Attempt]) -> Response:
        if not attempts:
            now_s = self.clock()
            serving = self.pool.candidates(req.group, now_s, model=req.model)
            if not serving and self.pool.candidates(req.group, now_s):
                self.metrics.shed.labels("model_not_found").inc()
                raise NotFound(
                    f"The model `{req.model}` does not exist on any upstream.",
                    code="model_not_found",
                    headers=req.extra_headers,
                )
            paused = [u.throttled_until_s - now_s for u in serving]
            if paused:  # all in rotation, all asked for a pause longer than we wait ourselves
                self.metrics.shed.labels("upstreams_busy").inc()
                raise TooManyRequests(
                    "every upstream asked to back off; retry later",
                    code="upstreams_busy",
                    retry_after_s=min(paused),
                    headers=req.extra_headers,
                )
            self.metrics.shed.labels("no_upstream").inc()
            raise Unavailable(
                "no healthy upstream is available",
                code="no_healthy_upstream",
                retry_after_s=self._retry_after_hint(req.group),
                headers=req.extra_headers,
            )
        last = attempts[-1]
        if all(a.outcome is Outcome.REFUSED for a in attempts):
            assert last.response is not None
            waits = [a.retry_after_s for a in attempts if a.retry_after_s is not None]
            last.response.headers["retry-after"] = retry_after_header(min(waits, default=1.0))
            return last.response
        if last.response is not None:
            return last.response
        assert last.error is not None
        last.error.headers.update(req.extra_headers)
        raise last.error

    def _retry_after_hint(self, group: str) -> float:
        """When to come back: the soonest an open circuit admits a trial, else a probe cycle."""
        now_s = self.clock()
        waits = [u.breaker.retry_in_s(now_s) for u in self.pool.group(group)]
        opens = [w for w in waits if w > 0]
        health = self.config.health
        probe_s = health.interval_s * health.healthy_threshold or health.eject_s
        return min(opens, default=probe_s)


def _model_not_found(status: int, body: bytes, model: str | None) -> bool:
    """A 404 in the OpenAI shape saying the request's model is not there."""
    if status != 404 or model is None:
        return False
    try:
        error = json.loads(body).get("error", {})
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("code") == "model_not_found"


def _is_event_stream(resp: httpx.Response) -> bool:
    return resp.headers.get("content-type", "").startswith("text/event-stream")
