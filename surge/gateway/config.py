"""GatewayConfig and its parts: frozen, validated once, built by the CLI or from a config file."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

from surge.batch.config import BatchConfig
from surge.config.flags import flag, group
from surge.gateway.epp.config import EppConfig
from surge.gateway.kv_config import KvConfig
from surge.http.deadline import TIMEOUT_HEADER
from surge.http.discovery import DnsTarget
from surge.observability.tracing import TracingConfig


class Policy(StrEnum):
    """Routing policies; the values are what `--policy` and config files accept."""

    ROUND_ROBIN = "round_robin"
    WEIGHTED = "weighted"
    LEAST_OUTSTANDING = "least_outstanding"
    POWER_OF_TWO = "power_of_two"
    SESSION = "session"
    PREFIX = "prefix"
    KV_AWARE = "kv_aware"  # by the blocks the replicas report holding (their KV events)


class DegradeAction(StrEnum):
    """What to do with a request when every upstream is saturated."""

    NONE = "none"  # send it anyway: the upstreams queue or refuse it themselves
    CAP_MAX_TOKENS = "cap_max_tokens"
    FALLBACK = "fallback"  # route to the fallback upstreams; shed when they are saturated too
    SHED = "shed"


def _positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")


def _at_least(name: str, value: float, low: float) -> None:
    if not value >= low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def normalize_url(url: str) -> str:
    """`http://host:port` without a trailing slash; raises ValueError for anything else."""
    url = url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"upstream url must look like http://host:port, got {url!r}")
    return url


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    url: str
    weight: float = 1.0  # the weighted policy's share; also scales virtual nodes on the hash ring
    max_in_flight: int | None = None  # saturation point for degradation; None: the gateway default

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", normalize_url(self.url))
        _positive("weight", self.weight)
        if self.max_in_flight is not None:
            _at_least("max_in_flight", self.max_in_flight, 1)


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """Per-upstream circuit breaker (defaults close to SGLang's model gateway)."""

    failure_threshold: int = field(
        default=5,
        metadata=flag("consecutive failures that open the circuit", name="breaker-failures"),
    )
    # or this share of failures within window_s ...
    failure_rate: float = field(
        default=0.5, metadata=flag("failure share to open", name="breaker-failure-rate")
    )
    # ... once the window holds at least this many outcomes
    min_requests: int = field(
        default=20, metadata=flag("outcomes before the rate counts", name="breaker-min-requests")
    )
    window_s: float = field(
        default=60.0, metadata=flag("seconds of the failure-rate window", name="breaker-window")
    )
    open_s: float = field(
        default=30.0, metadata=flag("seconds open before half-open", name="breaker-open")
    )
    half_open_max_requests: int = field(
        default=1,
        metadata=flag(
            "trial requests admitted at once while half-open", name="breaker-half-open-requests"
        ),
    )
    success_threshold: int = field(
        default=2, metadata=flag("trial successes that close the circuit", name="breaker-successes")
    )

    def __post_init__(self) -> None:
        _at_least("failure_threshold", self.failure_threshold, 1)
        if not 0 < self.failure_rate <= 1:
            raise ValueError(f"failure_rate must be in (0, 1], got {self.failure_rate}")
        _at_least("min_requests", self.min_requests, 1)
        _positive("window_s", self.window_s)
        _positive("open_s", self.open_s)
        _at_least("half_open_max_requests", self.half_open_max_requests, 1)
        _at_least("success_threshold", self.success_threshold, 1)


@dataclass(frozen=True, slots=True)
class RetryConfig:
    # first try included; each retry goes to an upstream not yet tried
    max_attempts: int = field(default=3, metadata=flag("tries per request, first included"))
    budget_ratio: float = field(
        default=0.2,
        metadata=flag(
            "retries allowed per request over the budget window (plus the minimum)",
            name="retry-budget-ratio",
        ),
    )
    # ... plus this many, so a quiet gateway can still retry
    budget_min_retries: int = field(
        default=10, metadata=flag("retries always allowed per window", name="retry-budget-min")
    )
    budget_window_s: float = field(
        default=10.0, metadata=flag("seconds of the budget window", name="retry-budget-window")
    )
    # full-jitter exponential: uniform(0, base * 2**n), capped
    backoff_base_s: float = field(
        default=0.01, metadata=flag("seconds, doubled per retry", name="retry-backoff-base")
    )
    backoff_max_s: float = field(
        default=0.5, metadata=flag("backoff cap in seconds", name="retry-backoff-max")
    )
    # wait at most this long for a refusing upstream's Retry-After
    max_retry_after_s: float = field(
        default=2.0,
        metadata=flag(
            "longest upstream Retry-After the gateway waits out itself", name="max-retry-after"
        ),
    )
    # A plain text stream whose upstream breaks mid-answer goes on, once, on another upstream
    # from where it stopped (gateway/resume.py); off: it ends with an error event.
    resume_streams: bool = field(
        default=True,
        metadata=flag(
            "end a stream whose upstream breaks mid-answer with an error event, instead of "
            "continuing its text on another upstream",
            name="no-stream-resume",
            negate=True,
        ),
    )

    def __post_init__(self) -> None:
        _at_least("max_attempts", self.max_attempts, 1)
        _at_least("budget_ratio", self.budget_ratio, 0)
        _at_least("budget_min_retries", self.budget_min_retries, 0)
        _positive("budget_window_s", self.budget_window_s)
        _at_least("backoff_base_s", self.backoff_base_s, 0)
        _at_least("backoff_max_s", self.backoff_max_s, self.backoff_base_s)
        _at_least("max_retry_after_s", self.max_retry_after_s, 0)


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    connect_s: float = field(default=2.0, metadata=flag("seconds", name="connect-timeout"))
    # a stream's first chunk (a JSON answer is bounded by total_s)
    first_byte_s: float = field(
        default=60.0, metadata=flag("seconds to the first chunk", name="first-byte-timeout")
    )
    idle_s: float = field(
        default=30.0, metadata=flag("between two chunks of a stream", name="idle-timeout")
    )
    total_s: float = field(
        default=600.0, metadata=flag("seconds per request", name="total-timeout")
    )

    def __post_init__(self) -> None:
        for name in ("connect_s", "first_byte_s", "idle_s", "total_s"):
            _positive(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class HealthConfig:
    # active /health probes; 0 turns them off
    interval_s: float = field(
        default=2.0, metadata=flag("seconds between probes; 0: none", name="health-interval")
    )
    timeout_s: float = field(
        default=1.0, metadata=flag("probe and scrape timeout in seconds", name="health-timeout")
    )
    # consecutive probe successes that bring an upstream back
    healthy_threshold: int = field(default=2, metadata=flag("probe successes to return"))
    # consecutive probe failures that take it out
    unhealthy_threshold: int = field(default=2, metadata=flag("probe failures to leave"))
    # consecutive failures of real traffic that take it out
    outlier_failures: int = field(default=3, metadata=flag("failed requests in a row to leave"))
    eject_s: float = field(
        default=10.0,
        metadata=flag("without probes, how long an outlier stays out", name="eject-time"),
    )

    def __post_init__(self) -> None:
        _at_least("interval_s", self.interval_s, 0)
        _positive("timeout_s", self.timeout_s)
        _at_least("healthy_threshold", self.healthy_threshold, 1)
        _at_least("unhealthy_threshold", self.unhealthy_threshold, 1)
        _at_least("outlier_failures", self.outlier_failures, 1)
        _positive("eject_s", self.eject_s)


@dataclass(frozen=True, slots=True)
class PrefixConfig:
    """Prefix-cache-aware routing; the balance thresholds follow SGLang's cache-aware router."""

    chunk_chars: int = field(
        default=256,
        metadata=flag(
            "one chained hash per this many characters of the rendered prompt",
            name="prefix-chunk-chars",
        ),
    )
    max_chunks: int = 256  # hash at most this many chunks of a prompt
    max_entries: int = field(
        default=100_000,
        metadata=flag("LRU bound on remembered chunk hashes", name="prefix-max-entries"),
    )
    balance_abs: int = field(
        default=8,
        metadata=flag(
            "leave the cached upstream when its load exceeds the least loaded by more than this ..."
        ),
    )
    balance_rel: float = field(
        default=1.5, metadata=flag("by more than balance_abs AND by more than this factor")
    )

    def __post_init__(self) -> None:
        _at_least("chunk_chars", self.chunk_chars, 16)
        _at_least("max_chunks", self.max_chunks, 1)
        _at_least("max_entries", self.max_entries, 1)
        _at_least("balance_abs", self.balance_abs, 0)
        _at_least("balance_rel", self.balance_rel, 1)


@dataclass(frozen=True, slots=True)
class LimitConfig:
    max_concurrency: int = field(
        default=1024, metadata=flag("requests the gateway forwards at once")
    )
    max_concurrency_per_key: int | None = field(
        default=None, metadata=flag("per Authorization header; None: no per-key cap")
    )
    max_queue: int = field(
        default=1024, metadata=flag("requests waiting for a slot; beyond this, 429 at once")
    )
    # a waiting request gives up with 429 after this long
    queue_timeout_s: float = field(
        default=30.0, metadata=flag("seconds a request may wait", name="queue-timeout")
    )

    def __post_init__(self) -> None:
        _at_least("max_concurrency", self.max_concurrency, 1)
        if self.max_concurrency_per_key is not None:
            _at_least("max_concurrency_per_key", self.max_concurrency_per_key, 1)
        _at_least("max_queue", self.max_queue, 0)
        _positive("queue_timeout_s", self.queue_timeout_s)


@dataclass(frozen=True, slots=True)
class DegradeConfig:
    action: DegradeAction = DegradeAction.NONE
    # per upstream, unless its UpstreamConfig says otherwise
    max_in_flight: int | None = field(
        default=None,
        metadata=flag(
            "an upstream is saturated at this many requests", name="max-in-flight-per-upstream"
        ),
    )
    # saturated when /metrics reports more waiting than this
    max_waiting: int | None = field(
        default=None,
        metadata=flag(
            "... or when its /metrics reports more waiting than this", name="saturation-waiting"
        ),
    )
    max_tokens_cap: int = field(
        default=64, metadata=flag("max_tokens cap when degrading", name="degrade-max-tokens")
    )
    shed_status: int = field(default=503, metadata=flag("429 or 503"))
    retry_after_s: float = field(
        default=1.0, metadata=flag("Retry-After of a shed request", name="shed-retry-after")
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", DegradeAction(self.action))
        if self.max_in_flight is not None:
            _at_least("max_in_flight", self.max_in_flight, 1)
        if self.max_waiting is not None:
            _at_least("max_waiting", self.max_waiting, 0)
        _at_least("max_tokens_cap", self.max_tokens_cap, 1)
        if self.shed_status not in (429, 503):
            raise ValueError(f"shed_status must be 429 or 503, got {self.shed_status}")
        _positive("retry_after_s", self.retry_after_s)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = field(default="127.0.0.1", metadata=flag("listen address (default 127.0.0.1)"))
    port: int = field(default=8080, metadata=flag("listen port (default 8080)"))
    upstreams: tuple[UpstreamConfig, ...] = ()
    fallback_upstreams: tuple[UpstreamConfig, ...] = ()
    upstreams_file: str | None = field(
        default=None, metadata=flag("JSON/TOML/text file of upstreams, re-read on change or SIGHUP")
    )
    # how often the file's mtime is checked
    reload_interval_s: float = field(
        default=1.0, metadata=flag("seconds between file checks", name="reload-interval")
    )
    policy: Policy = Policy.PREFIX
    session_header: str = field(
        default="x-session-id", metadata=flag("session policy key; else the body's `user`")
    )
    # upstream /metrics scrapes for load; 0 turns them off
    scrape_interval_s: float = field(
        default=1.0, metadata=flag("seconds between /metrics scrapes", name="scrape-interval")
    )
    max_body_bytes: int = field(
        default=8 * 1024 * 1024, metadata=flag("larger request bodies get 413")
    )
    seed: int = field(
        default=0, metadata=flag("the power-of-two policy and retry jitter draw from this")
    )
    log_requests: bool = field(default=False, metadata=flag())
    prefix: PrefixConfig = field(default_factory=PrefixConfig, metadata=group("prefix affinity"))
    kv: KvConfig = field(
        default_factory=KvConfig, metadata=group("KV-aware routing (--policy kv_aware)")
    )
    breaker: BreakerConfig = field(default_factory=BreakerConfig, metadata=group("circuit breaker"))
    retry: RetryConfig = field(default_factory=RetryConfig, metadata=group("retries"))
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig, metadata=group("timeouts"))
    health: HealthConfig = field(default_factory=HealthConfig, metadata=group("health checks"))
    limits: LimitConfig = field(default_factory=LimitConfig, metadata=group("limits"))
    degrade: DegradeConfig = field(
        default_factory=DegradeConfig,
        metadata=group("degradation (when every upstream is saturated)"),
    )
    # Envoy's external processor (GIE's endpoint picker) over the same pool and policies
    epp: EppConfig = field(
        default_factory=EppConfig,
        metadata=group("endpoint picker (Envoy ext_proc, Gateway API Inference Extension)"),
    )
    batch: BatchConfig = field(
        default_factory=BatchConfig,
        metadata=group("Batch API (/v1/files, /v1/batches, sent to the least loaded upstreams)"),
    )
    # OpenTelemetry spans over OTLP; None: off
    otlp_traces_endpoint: str | None = field(
        default=None,
        metadata=flag(
            "OpenTelemetry collector for spans over OTLP/HTTP, e.g. "
            "http://127.0.0.1:4318 "
            "(default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)"
        ),
    )
    # or "grpc"
    otlp_traces_protocol: str = field(
        default="http/protobuf",
        metadata=flag(
            "http/protobuf or grpc (default: "
            "$OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else http/protobuf)"
        ),
    )
    # With no upstream at all (an autoscaler scaled the fleet to zero), a request waits this
    # long for one to appear, counted in surge_gateway_requests_awaiting_upstream, which is
    # what wakes the autoscaler. 0: 503 at once.
    activation_timeout_s: float = field(
        default=0.0,
        metadata=flag(
            "with no upstream at all (scaled to zero), seconds a request waits "
            "for one (default 0: 503 at once)",
            name="activation-timeout",
        ),
    )
    # A client may ask for a shorter deadline than timeouts.total_s in this header (seconds);
    # each attempt tells its upstream, in the same header, the time left (deadline propagation).
    timeout_header: str = TIMEOUT_HEADER
    # its /metrics: desired/ready/forecast on the dashboard
    autoscaler_url: str | None = field(
        default=None, metadata=flag("an autoscaler's metrics, for /dashboard")
    )
    # dns://NAME:PORT targets (a headless Service): every address the name resolves to is a
    # primary upstream; re-resolved every discover_interval_s, so pods come and go.
    discover: tuple[str, ...] = ()
    discover_interval_s: float = field(
        default=5.0,
        metadata=flag(
            "seconds between DNS resolutions of dns:// upstreams (default 5)",
            name="discover-interval",
        ),
    )
    # SIGTERM: /health/ready turns 503 and new requests get 503 while those in flight finish,
    # for up to this long; then the gateway exits.
    drain_timeout_s: float = field(
        default=30.0,
        metadata=flag(
            "on SIGTERM, seconds in-flight requests may take to finish (default 30)",
            name="drain-timeout",
        ),
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", Policy(self.policy))
        self.tracing  # noqa: B018 (validates the endpoint)
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        object.__setattr__(self, "discover", tuple(self.discover))
        for target in self.discover:
            DnsTarget.parse(target)  # ValueError for anything but dns://NAME:PORT
        if not self.upstreams and self.upstreams_file is None and not self.discover:
            raise ValueError(
                "upstreams: give at least one upstream, an upstreams_file or a dns:// target"
            )
        _positive("discover_interval_s", self.discover_interval_s)
        _at_least("drain_timeout_s", self.drain_timeout_s, 0)
        urls = [u.url for u in (*self.upstreams, *self.fallback_upstreams)]
        if len(set(urls)) != len(urls):
            raise ValueError(f"upstreams: each url may appear once, got {urls}")
        _positive("reload_interval_s", self.reload_interval_s)
        _at_least("scrape_interval_s", self.scrape_interval_s, 0)
        _at_least("max_body_bytes", self.max_body_bytes, 1024)
        _at_least("activation_timeout_s", self.activation_timeout_s, 0)
        if not self.session_header:
            raise ValueError("session_header must not be empty")
        object.__setattr__(self, "session_header", self.session_header.lower())
        if (
            self.degrade.action is DegradeAction.FALLBACK
            and not self.fallback_upstreams
            and self.upstreams_file is None
        ):
            raise ValueError("degrade.action=fallback needs fallback_upstreams")

    @property
    def tracing(self) -> TracingConfig:
        return TracingConfig(
            otlp_endpoint=self.otlp_traces_endpoint,
            otlp_protocol=self.otlp_traces_protocol,
            service_name="surge-gateway",
            instance_id=f"{self.host}:{self.port}",
        )
