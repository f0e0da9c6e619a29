"""The gateway's Prometheus metrics, in a registry of its own (no process-wide globals)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from surge.gateway.upstreams import Upstream

OVERHEAD_BUCKETS = (
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.5,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
    640.0,
)  # fmt: skip


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        up = ["upstream"]
        self.requests = Counter(
            "surge_gateway_requests",
            "Client requests answered, by route and status.",
            ["route", "status"],
            registry=r,
        )
        self.upstream_requests = Counter(
            "surge_gateway_upstream_requests",
            "Attempts sent to an upstream, by outcome (success, failure, refused).",
            ["upstream", "outcome"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "surge_gateway_upstream_errors",
            "Upstream failures by kind (connect, timeout, http_5xx, protocol, stream_broken ...).",
            ["upstream", "kind"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "surge_gateway_upstream_latency_seconds",
            "Upstream latency: to the first byte (a stream's first chunk) and in total.",
            ["upstream", "phase"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_in_flight = Gauge(
            "surge_gateway_upstream_in_flight", "Requests in flight per upstream.", up, registry=r
        )
        self.breaker_state = Gauge(
            "surge_gateway_breaker_state",
            "Circuit breaker per upstream: 0 closed, 1 half-open, 2 open.",
            up,
            registry=r,
        )
        self.upstream_healthy = Gauge(
            "surge_gateway_upstream_healthy", "1 when the upstream is in rotation.", up, registry=r
        )
        self.stream_resumes = Counter(
            "surge_gateway_stream_resumes",
            "Streams broken mid-answer and continued on another upstream (resumed), ended at "
            "their token limit (at_limit), or not continued (failed).",
            ["outcome"],
            registry=r,
        )
        self.retries = Counter(
            "surge_gateway_retries",
            "Retries on another upstream, by the reason.",
            ["reason"],
            registry=r,
        )
        self.retries_denied = Counter(
            "surge_gateway_retries_denied",
            "Retries not made (budget spent, attempts used up, no upstream left, deadline).",
            ["reason"],
            registry=r,
        )
        self.degraded = Counter(
            "surge_gateway_degraded_requests",
            "Requests degraded because every upstream was saturated, by action.",
            ["action"],
            registry=r,
        )
        self.shed = Counter(
            "surge_gateway_shed_requests",
            "Requests refused by the gateway itself, by reason.",
            ["reason"],
            registry=r,
        )
        self.overhead = Histogram(
            "surge_gateway_overhead_seconds",
            "Time the gateway itself adds: parsing and routing before the upstream request, "
            "and building the response after its head (queueing and backoff excluded).",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "surge_gateway_queue_wait_seconds",
            "Time waiting for a concurrency slot.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "surge_gateway_requests_in_flight", "Client requests holding a slot.", registry=r
        )
        self.awaiting_upstream = Gauge(
            "surge_gateway_requests_awaiting_upstream",
            "Client requests waiting for an upstream to exist (the fleet is scaled to zero).",
            registry=r,
        )
        self.waiting = Gauge(
            "surge_gateway_requests_waiting", "Client requests waiting for a slot.", registry=r
        )
        self._labelled: set[str] = set()

    def refresh(
        self, upstreams: Sequence[Upstream], now_s: float, in_flight: int, waiting: int
    ) -> None:
        """Set the gauges from current state (called at scrape time)."""
        self.in_flight.set(in_flight)
        self.waiting.set(waiting)
        urls = {u.url for u in upstreams}
        for url in self._labelled - urls:
            for gauge in (self.upstream_in_flight, self.breaker_state, self.upstream_healthy):
                gauge.remove(url)
        self._labelled = urls
        for u in upstreams:
            self.upstream_in_flight.labels(u.url).set(u.in_flight)
            self.breaker_state.labels(u.url).set(int(u.breaker.state(now_s)))
            self.upstream_healthy.labels(u.url).set(1 if u.health.is_healthy(now_s) else 0)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
