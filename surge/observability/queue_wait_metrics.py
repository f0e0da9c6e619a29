"""How good admission's wait estimate is, and how fast a refusal is: on the server's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

WAIT_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
RATIO_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0)
REFUSAL_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip


class QueueWaitMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry) -> None:
        self.model_name = model_name
        m = ["model_name"]
        self.estimate = Histogram(
            "surge:queue_wait_estimate_seconds",
            "Admission's estimate of a request's wait for its first token, by outcome.",
            ["model_name", "outcome"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.observed = Histogram(
            "surge:queue_wait_observed_seconds",
            "The wait for a first token of requests admitted with an estimate.",
            m,
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.error = Histogram(
            "surge:queue_wait_estimate_error_seconds",
            "|observed - estimated| wait for a first token, per admitted request.",
            m,
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.ratio = Histogram(
            "surge:queue_wait_observed_over_estimate",
            "Observed over estimated wait for a first token (estimates of 10 ms and more).",
            m,
            buckets=RATIO_BUCKETS,
            registry=registry,
        )
        self.refusal = Histogram(
            "surge:admission_refusal_seconds",
            "Server time from a request's arrival to its refusal at admission (429/503).",
            m,
            buckets=REFUSAL_BUCKETS,
            registry=registry,
        )
        for h in (self.observed, self.error, self.ratio, self.refusal):
            h.labels(model_name)

    def observe_estimate(self, estimate_s: float, admitted: bool) -> None:
        outcome = "admitted" if admitted else "refused"
        self.estimate.labels(self.model_name, outcome).observe(estimate_s)

    def observe_wait(self, estimate_s: float, observed_s: float) -> None:
        name = self.model_name
        self.observed.labels(name).observe(observed_s)
        self.error.labels(name).observe(abs(observed_s - estimate_s))
        if estimate_s >= 0.01:
            self.ratio.labels(name).observe(observed_s / estimate_s)

    def observe_refusal(self, seconds: float) -> None:
        self.refusal.labels(self.model_name).observe(max(0.0, seconds))
