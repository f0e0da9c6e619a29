"""GatewayConfig and its parts: frozen, validated once, built by the CLI or from a config file."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

from surge.deadline import TIMEOUT_HEADER
from surge.discovery import DnsTarget
from surge.observability.tracing import TracingConfig


class Policy(StrEnum):
    """Routing policies; the values are what `--policy` and config files accept."""

    ROUND_ROBIN = "round_robin"
    WEIGHTED = "weighted"
    LEAST_OUTSTANDING = "least_outstanding"
    POWER_OF_TWO = "power_of_two"
    SESSION = "session"
    PREFIX = "prefix"


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

    failure_threshold: int = 5  # consecutive failures that open the circuit
    failure_rate: float = 0.5  # or this share of failures within window_s ...
    min_requests: int = 20  # ... once the window holds at least this many outcomes
    window_s: float = 60.0
    open_s: float = 30.0  # cool-down before half-open
    half_open_max_requests: int = 1  # trial requests admitted at once while half-open
    success_threshold: int = 2  # trial successes that close the circuit

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
    max_attempts: int = 3  # first try included; each retry goes to an upstream not yet tried
    budget_ratio: float = 0.2  # retries allowed per request over budget_window_s ...
    budget_min_retries: int = 10  # ... plus this many, so a quiet gateway can still retry
    budget_window_s: float = 10.0
    backoff_base_s: float = 0.01  # full-jitter exponential: uniform(0, base * 2**n), capped
    backoff_max_s: float = 0.5
    max_retry_after_s: float = 2.0  # wait at most this long for a refusing upstream's Retry-After
    # A plain text stream whose upstream breaks mid-answer goes on, once, on another upstream
    # from where it stopped (gateway/resume.py); off: it ends with an error event.
    resume_streams: bool = True

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
    connect_s: float = 2.0
    first_byte_s: float = 60.0  # a stream's first chunk (a JSON answer is bounded by total_s)
    idle_s: float = 30.0  # between two chunks of a stream
    total_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("connect_s", "first_byte_s", "idle_s", "total_s"):
            _positive(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class HealthConfig:
    interval_s: float = 2.0  # active /health probes; 0 turns them off
    timeout_s: float = 1.0
    healthy_threshold: int = 2  # consecutive probe successes that bring an upstream back
    unhealthy_threshold: int = 2  # consecutive probe failures that take it out
    outlier_failures: int = 3  # consecutive failures of real traffic that take it out
    eject_s: float = 10.0  # without probes, how long an outlier stays out

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

    chunk_chars: int = 256  # one chained hash per this many characters of the rendered prompt
    max_chunks: int = 256  # hash at most this many chunks of a prompt
    max_entries: int = 100_000  # LRU bound on remembered chunk hashes
    balance_abs: int = 8  # leave the cached upstream when its load exceeds the least-loaded's
    balance_rel: float = 1.5  # by more than balance_abs AND by more than this factor

    def __post_init__(self) -> None:
        _at_least("chunk_chars", self.chunk_chars, 16)
        _at_least("max_chunks", self.max_chunks, 1)
        _at_least("max_entries", self.max_entries, 1)
        _at_least("balance_abs", self.balance_abs, 0)
        _at_least("balance_rel", self.balance_rel, 1)


@dataclass(frozen=True, slots=True)
class LimitConfig:
    max_concurrency: int = 1024  # requests the gateway forwards at once
    max_concurrency_per_key: int | None = None  # per Authorization header; None: no per-key cap
    max_queue: int = 1024  # requests waiting for a slot; beyond this, 429 at once
    queue_timeout_s: float = 30.0  # a waiting request gives up with 429 after this long

    def __post_init__(self) -> None:
        _at_least("max_concurrency", self.max_concurrency, 1)
        if self.max_concurrency_per_key is not None:
            _at_least("max_concurrency_per_key", self.max_concurrency_per_key, 1)
        _at_least("max_queue", self.max_queue, 0)
        _positive("queue_timeout_s", self.queue_timeout_s)


@dataclass(frozen=True, slots=True)
class DegradeConfig:
    action: DegradeAction = DegradeAction.NONE
    max_in_flight: int | None = None  # per upstream, unless its UpstreamConfig says otherwise
    max_waiting: int | None = None  # saturated when /metrics reports more waiting than this
    max_tokens_cap: int = 64
    shed_status: int = 503
    retry_after_s: float = 1.0

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
    host: str = "127.0.0.1"
    port: int = 8080
    upstreams: tuple[UpstreamConfig, ...] = ()
    fallback_upstreams: tuple[UpstreamConfig, ...] = ()
    upstreams_file: str | None = None  # re-read on mtime change or SIGHUP; adds to `upstreams`
    reload_interval_s: float = 1.0  # how often the file's mtime is checked
    policy: Policy = Policy.PREFIX
    session_header: str = "x-session-id"  # session policy key; else the body's `user`
    scrape_interval_s: float = 1.0  # upstream /metrics scrapes for load; 0 turns them off
    max_body_bytes: int = 8 * 1024 * 1024
    seed: int = 0  # the power-of-two policy and retry jitter draw from this
    log_requests: bool = False
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    limits: LimitConfig = field(default_factory=LimitConfig)
    degrade: DegradeConfig = field(default_factory=DegradeConfig)
    otlp_traces_endpoint: str | None = None  # OpenTelemetry spans over OTLP; None: off
    otlp_traces_protocol: str = "http/protobuf"  # or "grpc"
    # With no upstream at all (an autoscaler scaled the fleet to zero), a request waits this
    # long for one to appear, counted in surge_gateway_requests_awaiting_upstream, which is
    # what wakes the autoscaler. 0: 503 at once.
    activation_timeout_s: float = 0.0
    # A client may ask for a shorter deadline than timeouts.total_s in this header (seconds);
    # each attempt tells its upstream, in the same header, the time left (deadline propagation).
    timeout_header: str = TIMEOUT_HEADER
    autoscaler_url: str | None = None  # its /metrics: desired/ready/forecast on the dashboard
    # dns://NAME:PORT targets (a headless Service): every address the name resolves to is a
    # primary upstream; re-resolved every discover_interval_s, so pods come and go.
    discover: tuple[str, ...] = ()
    discover_interval_s: float = 5.0
    # SIGTERM: /health/ready turns 503 and new requests get 503 while those in flight finish,
    # for up to this long; then the gateway exits.
    drain_timeout_s: float = 30.0

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
