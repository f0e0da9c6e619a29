"""Prometheus metrics of the server, named like vLLM's so existing dashboards work unchanged."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from operator import attrgetter

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from surge.engine.stats import EngineStats

# Bucket edges copied from vLLM so quantiles compare across the two servers.
OVERHEAD_BUCKETS: tuple[float, ...] = (
    0.0002, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0,
)  # fmt: skip
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS: tuple[float, ...] = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
)  # fmt: skip
N_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20)

# Engine counters mirrored from EngineStats' cumulative parts: (part.field, metric name, help).
_ENGINE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("prefix_cache.queries", "vllm:prefix_cache_queries", "Prefix cache queries, in tokens."),
    ("prefix_cache.hits", "vllm:prefix_cache_hits", "Prefix cache hits, in tokens."),
    ("scheduler.num_preemptions", "vllm:num_preemptions", "Cumulative number of preemptions."),
    ("steps.prompt_tokens", "vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("steps.generation_tokens", "vllm:generation_tokens", "Number of generation tokens processed."),
    ("spec.num_drafts", "vllm:spec_decode_num_drafts", "Speculative drafts verified."),
    ("spec.draft_tokens", "vllm:spec_decode_num_draft_tokens", "Draft tokens verified."),
    ("spec.accepted_tokens", "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted."),
    (
        "steps.step_time_s",
        "surge:engine_step_seconds",
        "Engine time in steps (computing), seconds.",
    ),
    (
        "steps.wait_time_s",
        "surge:engine_wait_seconds",
        "Engine time blocked waiting for work, seconds.",
    ),
    (
        "scheduler.num_blocked_on_kv",
        "surge:engine_kv_blocked_admissions",
        "Admissions stopped for want of KV blocks (a step's admissions end there).",
    ),
)

MAX_PRIORITY_LABELS = 32
DEFAULT_MAX_TENANTS = 1000
OTHER_TENANT = "other"


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to and including max_value (vLLM's token-count buckets)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(float(value))
        exponent += 1


def time_per_output_token(e2e_s: float, ttft_s: float | None, num_generation_tokens: int) -> float:
    """Mean decode gap after the first token; 0 when there is no gap to average."""
    if num_generation_tokens <= 1 or ttft_s is None:
        return 0.0
    # Clamp: e2e and ttft come from separate clock reads and may disagree by a hair.
    return max(0.0, (e2e_s - ttft_s) / (num_generation_tokens - 1))


class ServerMetrics:
    """Every server metric, held in one registry owned by this object (none is module-global)."""

    def __init__(
        self,
        model_name: str,
        registry: CollectorRegistry | None = None,
        max_model_len: int = 8192,
        max_tenants: int = DEFAULT_MAX_TENANTS,
    ) -> None:
        self.model_name = model_name
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_tenants = max_tenants
        self._lock = threading.Lock()
        self._tenants: set[str] = set()
        self._last_engine: dict[str, float] = {field: 0 for field, _, _ in _ENGINE_COUNTERS}
        self._cache_config: tuple[int, int] | None = None
        token_buckets = build_1_2_5_buckets(max_model_len)
        reg, m = self.registry, ["model_name"]

        # Engine state, refreshed by update_engine.
        self.num_running = Gauge(
            "vllm:num_requests_running", "Requests in model execution batches.", m, registry=reg
        )
        self.num_waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be processed.", m, registry=reg
        )
        self.kv_cache_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent.", m, registry=reg
        )
        self.prefix_cache_blocks = Gauge(
            "surge:prefix_cache_blocks", "KV blocks the prefix cache holds.", m, registry=reg
        )
        self.engine_counters = {
            field: Counter(name, doc, m, registry=reg) for field, name, doc in _ENGINE_COUNTERS
        }
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Number of tokens per engine step.",
            m,
            buckets=ITERATION_TOKEN_BUCKETS,
            registry=reg,
        )
        self.cache_config_info = Gauge(
            "vllm:cache_config_info",
            "Information of the KV cache configuration.",
            ["model_name", "num_gpu_blocks", "block_size"],
            registry=reg,
        )
        self.lora_requests_info = Gauge(
            "vllm:lora_requests_info",
            "LoRA adapters of running and waiting requests (comma-separated); the value is "
            "the time of the reading, as vLLM's.",
            ["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
            registry=reg,
        )
        self.engine_healthy = Gauge(
            "vllm:engine_healthy", "1 when the engine is serving, else 0.", m, registry=reg
        )
        # The Responses API's stored responses, and those running in the background.
        self.responses_stored = Gauge(
            "surge:responses_stored",
            "Responses API responses kept for later turns.",
            m,
            registry=reg,
        )
        self.responses_background = Gauge(
            "surge:responses_background",
            "Background responses not finished yet.",
            m,
            registry=reg,
        )

        # Per finished request.
        self.request_success = Counter(
            "vllm:request_success",
            "Count of finished requests.",
            ["model_name", "finished_reason"],
            registry=reg,
        )

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, m, buckets=buckets, registry=reg)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Mean time per output token of a request, in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Time spent waiting in the queue, in seconds.",
            LATENCY_BUCKETS,
        )
        self.prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens per request.", token_buckets
        )
        self.generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generated tokens per request.",
            token_buckets,
        )
        self.params_n = histogram("vllm:request_params_n", "The n request parameter.", N_BUCKETS)
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens", "The max_tokens request parameter.", token_buckets
        )

        # Admission and aborts.
        self.received = Counter(
            "surge:requests_received",
            "Generation requests that reached admission, admitted or refused: the demand an "
            "autoscaler forecasts (vLLM production-stack's router counts the same).",
            m,
            registry=reg,
        )
        self.rejections = Counter(
            "vllm:admission_rejections",
            "Requests refused at admission, by reason.",
            ["model_name", "reason"],
            registry=reg,
        )
        self.aborts = Counter(
            "surge:request_aborts",
            "Requests aborted after admission, by reason.",
            ["model_name", "reason"],
            registry=reg,
        )

        self.overhead = Histogram(
            "surge:request_overhead_seconds",
            "Server time from HTTP arrival to the request queued in the engine.",
            ["model_name"],
            buckets=OVERHEAD_BUCKETS,
            registry=reg,
        )

        # Per tenant; the label set is capped so a flood of tenant ids cannot grow memory.
        self.tenant_generation_tokens = Counter(
            "surge:tenant_generation_tokens",
            "Generated tokens per tenant.",
            ["model_name", "tenant"],
            registry=reg,
        )
        self.tenant_queue_time = Histogram(
            "surge:tenant_queue_time_seconds",
            "Queue time per tenant, in seconds.",
            ["model_name", "tenant"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.tenant_ttft = Histogram(
            "surge:tenant_time_to_first_token_seconds",
            "Time to first token per tenant, in seconds.",
            ["model_name", "tenant"],
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.tenant_prompt_tokens = Counter(
            "surge:tenant_prompt_tokens",
            "Prompt tokens per tenant.",
            ["model_name", "tenant"],
            registry=reg,
        )
        self.tenant_requests = Counter(
            "surge:tenant_requests",
            "Finished requests per tenant, by finish reason.",
            ["model_name", "tenant", "finished_reason"],
            registry=reg,
        )
        # The engine's own count: a tenant's share of service is its rate over the sum of rates.
        self.tenant_scheduled_tokens = Counter(
            "surge:tenant_scheduled_tokens",
            "Tokens the engine scheduled per tenant (prefill and decode).",
            ["model_name", "tenant"],
            registry=reg,
        )
        self.priority_queue_time = Histogram(
            "surge:priority_queue_time_seconds",
            "Queue time per request priority, in seconds.",
            ["model_name", "priority"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.priority_ttft = Histogram(
            "surge:priority_time_to_first_token_seconds",
            "Time to first token per request priority, in seconds.",
            ["model_name", "priority"],
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self._last_tenant_tokens: dict[str, int] = {}
        self._priorities: set[int] = set()

        # Create the unlabelled-by-reason series now so they read 0 from the first scrape.
        for metric in (self.num_running, self.num_waiting, self.kv_cache_usage):
            metric.labels(model_name)
        for counter in self.engine_counters.values():
            counter.labels(model_name)
        for h in (self.iteration_tokens, self.ttft, self.itl, self.tpot, self.e2e):
            h.labels(model_name)
        for h in (self.queue_time, self.prompt_tokens, self.generation_tokens):
            h.labels(model_name)
        for h in (self.params_n, self.params_max_tokens):
            h.labels(model_name)
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(model_name, reason)

    def update_engine(self, stats: EngineStats) -> None:
        """Copy a stats snapshot in; cumulative engine counters become deltas on ours."""
        name = self.model_name
        self.num_running.labels(name).set(stats.num_running)
        self.num_waiting.labels(name).set(stats.num_waiting)
        self.kv_cache_usage.labels(name).set(stats.kv_cache_usage)
        self.prefix_cache_blocks.labels(name).set(stats.prefix_cache_blocks)
        with self._lock:
            for field, counter in self.engine_counters.items():
                value: float = attrgetter(field)(stats)
                last = self._last_engine[field]
                # A lower value means the engine restarted from zero: all of it is new.
                delta = value - last if value >= last else value
                if delta > 0:
                    counter.labels(name).inc(delta)
                self._last_engine[field] = value
            config = (stats.num_blocks, stats.block_size)
            if config != self._cache_config:
                # Drop the old label set so only the current configuration reads 1.
                self.cache_config_info.clear()
                self.cache_config_info.labels(name, str(config[0]), str(config[1])).set(1)
                self._cache_config = config
            if stats.max_loras:
                self.lora_requests_info.clear()  # only the current sets read
                self.lora_requests_info.labels(
                    ",".join(stats.lora_running),
                    ",".join(stats.lora_waiting),
                    str(stats.max_loras),
                ).set_to_current_time()
            for tenant, value in stats.scheduler.tenant_tokens.items():
                last = self._last_tenant_tokens.get(tenant, 0)
                delta = value - last if value >= last else value
                if delta > 0 and tenant:
                    label = self._tenant_label_locked(tenant)
                    self.tenant_scheduled_tokens.labels(name, label).inc(delta)
                self._last_tenant_tokens[tenant] = value
        step_tokens = self.iteration_tokens.labels(name)
        for tokens in stats.iteration_tokens:
            step_tokens.observe(tokens)

    def observe_request(
        self,
        *,
        finish_reason: str,
        ttft_s: float | None,
        e2e_s: float,
        queue_s: float,
        itl_s: Sequence[float],
        num_prompt_tokens: int,
        num_generation_tokens: int,
        max_tokens: int | None,
        n: int,
        tenant: str = "",
        priority: int = 0,
    ) -> None:
        """Record one finished request (one per sequence of an n > 1 request)."""
        name = self.model_name
        self.request_success.labels(name, str(finish_reason)).inc()
        if ttft_s is not None:  # None: finished (e.g. aborted) before its first token
            self.ttft.labels(name).observe(ttft_s)
        itl = self.itl.labels(name)
        for gap in itl_s:
            itl.observe(gap)
        self.tpot.labels(name).observe(time_per_output_token(e2e_s, ttft_s, num_generation_tokens))
        self.e2e.labels(name).observe(e2e_s)
        self.queue_time.labels(name).observe(queue_s)
        self.prompt_tokens.labels(name).observe(num_prompt_tokens)
        self.generation_tokens.labels(name).observe(num_generation_tokens)
        self.params_n.labels(name).observe(n)
        if max_tokens is not None:  # None: no explicit limit, nothing meaningful to record
            self.params_max_tokens.labels(name).observe(max_tokens)
        if tenant:
            label = self.tenant_label(tenant)
            self.tenant_generation_tokens.labels(name, label).inc(num_generation_tokens)
            self.tenant_prompt_tokens.labels(name, label).inc(num_prompt_tokens)
            self.tenant_queue_time.labels(name, label).observe(queue_s)
            self.tenant_requests.labels(name, label, str(finish_reason)).inc()
            if ttft_s is not None:
                self.tenant_ttft.labels(name, label).observe(ttft_s)
        plabel = self.priority_label(priority)
        self.priority_queue_time.labels(name, plabel).observe(queue_s)
        if ttft_s is not None:
            self.priority_ttft.labels(name, plabel).observe(ttft_s)

    def tenant_label(self, tenant: str) -> str:
        """The tenant's own label while under the cap, else the shared 'other'."""
        with self._lock:
            return self._tenant_label_locked(tenant)

    def _tenant_label_locked(self, tenant: str) -> str:
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < self.max_tenants:
            self._tenants.add(tenant)
            return tenant
        return OTHER_TENANT

    def priority_label(self, priority: int) -> str:
        """Priorities are client-chosen integers: the first few distinct ones get a label each."""
        with self._lock:
            if priority in self._priorities or len(self._priorities) < MAX_PRIORITY_LABELS:
                self._priorities.add(priority)
                return str(priority)
        return OTHER_TENANT

    def observe_received(self) -> None:
        self.received.labels(self.model_name).inc()

    def observe_rejection(self, reason: str) -> None:
        self.rejections.labels(self.model_name, reason).inc()

    def observe_overhead(self, seconds: float) -> None:
        self.overhead.labels(self.model_name).observe(max(0.0, seconds))

    def observe_abort(self, reason: str) -> None:
        self.aborts.labels(self.model_name, reason).inc()

    def set_responses(self, stored: int, background: int) -> None:
        self.responses_stored.labels(self.model_name).set(stored)
        self.responses_background.labels(self.model_name).set(background)

    def set_health(self, healthy: bool) -> None:
        self.engine_healthy.labels(self.model_name).set(1 if healthy else 0)

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, ready for an HTTP response."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
