"""Prometheus metrics of /v1/embeddings and its dynamic batcher (Triton reports the same four:
requests, batch sizes, queue time and compute time)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUEUE_TIME_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


class EmbeddingMetrics:
    def __init__(self, model_name: str, registry: CollectorRegistry) -> None:
        self.model_name = model_name
        m, reg = ["model_name"], registry
        self.requests = Counter(
            "surge:embedding_requests", "Embedding requests answered.", m, registry=reg
        )
        self.inputs = Counter(
            "surge:embedding_inputs", "Inputs embedded (one vector each).", m, registry=reg
        )
        self.prompt_tokens = Counter(
            "surge:embedding_prompt_tokens", "Tokens of embedded inputs.", m, registry=reg
        )
        self.batch_size = Histogram(
            "surge:embedding_batch_size",
            "Inputs per model batch.",
            m,
            buckets=BATCH_SIZE_BUCKETS,
            registry=reg,
        )
        self.queue_time = Histogram(
            "surge:embedding_queue_time_seconds",
            "Time an input waited for its batch.",
            m,
            buckets=QUEUE_TIME_BUCKETS,
            registry=reg,
        )
        self.batch_time = Histogram(
            "surge:embedding_batch_duration_seconds",
            "Model time of one batch.",
            m,
            buckets=QUEUE_TIME_BUCKETS,
            registry=reg,
        )
        self.queue_depth = Gauge(
            "surge:embedding_queue_depth", "Inputs waiting for a batch.", m, registry=reg
        )

    def observe_request(self, num_inputs: int, num_tokens: int) -> None:
        self.requests.labels(self.model_name).inc()
        self.inputs.labels(self.model_name).inc(num_inputs)
        self.prompt_tokens.labels(self.model_name).inc(num_tokens)

    def observe_batch(self, size: int, queue_waits_s: Sequence[float], run_s: float) -> None:
        """Called on the event loop after each batch."""
        self.batch_size.labels(self.model_name).observe(size)
        queue_time = self.queue_time.labels(self.model_name)
        for wait in queue_waits_s:
            queue_time.observe(wait)
        self.batch_time.labels(self.model_name).observe(run_s)

    def set_queue_depth(self, depth: int) -> None:
        self.queue_depth.labels(self.model_name).set(depth)
