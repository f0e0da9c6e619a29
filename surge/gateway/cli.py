"""`surge gateway ...`: argparse (over an optional --config file) -> GatewayConfig -> serve."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from typing import Any

from surge.event_loop import run as run_event_loop
from surge.gateway.config import DegradeAction, GatewayConfig, Policy
from surge.gateway.config_file import config_from_mapping, read_mapping
from surge.gateway.launch import serve
from surge.observability.tracing import endpoint_from_env, protocol_from_env

# flag -> (config section or None for top level, field, type, help). Every flag defaults to
# None, meaning "not given": then the config file's value, else the dataclass default, holds.
_FLAGS: dict[str, tuple[str | None, str, type, str]] = {
    "--host": (None, "host", str, "listen address (default 127.0.0.1)"),
    "--port": (None, "port", int, "listen port (default 8080)"),
    "--upstreams-file": (None, "upstreams_file", str,
                         "JSON/TOML/text file of upstreams, re-read on change or SIGHUP"),
    "--reload-interval": (None, "reload_interval_s", float, "seconds between file checks"),
    "--session-header": (None, "session_header", str, "session policy key header"),
    "--scrape-interval": (None, "scrape_interval_s", float, "seconds between /metrics scrapes"),
    "--autoscaler-url": (None, "autoscaler_url", str, "an autoscaler's metrics, for /dashboard"),
    "--max-body-bytes": (None, "max_body_bytes", int, "larger request bodies get 413"),
    "--seed": (None, "seed", int, "seed of the power-of-two draws and retry jitter"),
    "--prefix-chunk-chars": ("prefix", "chunk_chars", int, "characters per prefix hash"),
    "--prefix-max-entries": ("prefix", "max_entries", int, "prefix LRU bound"),
    "--balance-abs": ("prefix", "balance_abs", int, "leave the cached upstream when its load "
                      "exceeds the least loaded by more than this ..."),
    "--balance-rel": ("prefix", "balance_rel", float, "... and by more than this factor"),
    "--breaker-failures": ("breaker", "failure_threshold", int, "consecutive failures to open"),
    "--breaker-failure-rate": ("breaker", "failure_rate", float, "failure share to open"),
    "--breaker-min-requests": ("breaker", "min_requests", int, "outcomes before the rate counts"),
    "--breaker-window": ("breaker", "window_s", float, "seconds of the failure-rate window"),
    "--breaker-open": ("breaker", "open_s", float, "seconds open before half-open"),
    "--breaker-half-open-requests": ("breaker", "half_open_max_requests", int,
                                     "trial requests at once while half-open"),
    "--breaker-successes": ("breaker", "success_threshold", int, "trial successes to close"),
    "--max-attempts": ("retry", "max_attempts", int, "tries per request, first included"),
    "--retry-budget-ratio": ("retry", "budget_ratio", float, "retries per request in window"),
    "--retry-budget-min": ("retry", "budget_min_retries", int, "retries always allowed per window"),
    "--retry-budget-window": ("retry", "budget_window_s", float, "seconds of the budget window"),
    "--retry-backoff-base": ("retry", "backoff_base_s", float, "seconds, doubled per retry"),
    "--retry-backoff-max": ("retry", "backoff_max_s", float, "backoff cap in seconds"),
    "--max-retry-after": ("retry", "max_retry_after_s", float,
                          "longest upstream Retry-After the gateway waits out itself"),
    "--connect-timeout": ("timeouts", "connect_s", float, "seconds"),
    "--first-byte-timeout": ("timeouts", "first_byte_s", float, "seconds to the first chunk"),
    "--idle-timeout": ("timeouts", "idle_s", float, "seconds between stream chunks"),
    "--total-timeout": ("timeouts", "total_s", float, "seconds per request"),
    "--health-interval": ("health", "interval_s", float, "seconds between probes; 0: none"),
    "--health-timeout": ("health", "timeout_s", float, "probe and scrape timeout in seconds"),
    "--healthy-threshold": ("health", "healthy_threshold", int, "probe successes to return"),
    "--unhealthy-threshold": ("health", "unhealthy_threshold", int, "probe failures to leave"),
    "--outlier-failures": ("health", "outlier_failures", int, "failed requests in a row to leave"),
    "--eject-time": ("health", "eject_s", float, "seconds an outlier stays out without probes"),
    "--max-concurrency": ("limits", "max_concurrency", int, "requests forwarded at once"),
    "--max-concurrency-per-key": ("limits", "max_concurrency_per_key", int,
                                  "per Authorization header"),
    "--max-queue": ("limits", "max_queue", int, "requests waiting for a slot; then 429"),
    "--queue-timeout": ("limits", "queue_timeout_s", float, "seconds a request may wait"),
    "--max-in-flight-per-upstream": ("degrade", "max_in_flight", int,
                                     "an upstream is saturated at this many requests"),
    "--saturation-waiting": ("degrade", "max_waiting", int,
                             "... or when its /metrics reports more waiting than this"),
    "--degrade-max-tokens": ("degrade", "max_tokens_cap", int, "max_tokens cap when degrading"),
    "--shed-status": ("degrade", "shed_status", int, "429 or 503"),
    "--shed-retry-after": ("degrade", "retry_after_s", float, "Retry-After of a shed request"),
    "--activation-timeout": (None, "activation_timeout_s", float,
                             "with no upstream at all (scaled to zero), seconds a request waits "
                             "for one (default 0: 503 at once)"),
    "--discover-interval": (None, "discover_interval_s", float,
                            "seconds between DNS resolutions of dns:// upstreams (default 5)"),
    "--drain-timeout": (None, "drain_timeout_s", float,
                        "on SIGTERM, seconds in-flight requests may take to finish (default 30)"),
    "--otlp-traces-endpoint": (None, "otlp_traces_endpoint", str,
                               "OpenTelemetry collector for spans over OTLP/HTTP, e.g. "
                               "http://127.0.0.1:4318 "
                               "(default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)"),
    "--otlp-traces-protocol": (None, "otlp_traces_protocol", str,
                               "http/protobuf or grpc (default: "
                               "$OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else http/protobuf)"),
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="surge gateway",
        description="One OpenAI-compatible address in front of many Surge/vLLM servers.",
    )
    p.add_argument("--config", help="gateway config file (JSON or TOML); flags override it")
    p.add_argument(
        "--upstream",
        action="append",
        default=None,
        metavar="URL[,weight=W]",
        help="an upstream server (repeatable); ',max_in_flight=N' also accepted; "
        "dns://NAME:PORT: every address NAME resolves to (a headless Service), re-resolved "
        "every --discover-interval",
    )
    p.add_argument(
        "--fallback-upstream",
        action="append",
        default=None,
        metavar="URL",
        help="where to go when every upstream is saturated or down (repeatable)",
    )
    p.add_argument(
        "--policy",
        choices=[x.value for x in Policy],
        default=None,
        help="routing policy (default prefix)",
    )
    p.add_argument(
        "--degrade",
        choices=[x.value for x in DegradeAction],
        default=None,
        help="what to do when every upstream is saturated (default none)",
    )
    for flag, (_, _, kind, help_text) in _FLAGS.items():
        p.add_argument(flag, type=kind, default=None, help=help_text)
    p.add_argument("--log-requests", action="store_true", default=None)
    p.add_argument(
        "--no-stream-resume",
        action="store_true",
        default=None,
        help="end a stream whose upstream breaks mid-answer with an error event, instead of "
        "continuing its text on another upstream",
    )
    p.add_argument("--log-level", default="INFO")
    return p  # fmt: skip


def parse_upstream(spec: str) -> dict[str, Any]:
    """`URL[,weight=W][,max_in_flight=N]` -> an upstream table."""
    url, *options = spec.split(",")
    out: dict[str, Any] = {"url": url}
    for opt in options:
        name, sep, value = opt.partition("=")
        if not sep or name not in ("weight", "max_in_flight"):
            raise ValueError(f"--upstream {spec!r}: options are weight=W and max_in_flight=N")
        try:
            out[name] = float(value) if name == "weight" else int(value)
        except ValueError as e:
            raise ValueError(f"--upstream {spec!r}: bad {name} {value!r}") from e
    return out


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    data: dict[str, Any] = read_mapping(args.config) if args.config else {}
    overrides: dict[str, Any] = {}
    for flag, (section, name, _, _) in _FLAGS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            (overrides.setdefault(section, {}) if section else overrides)[name] = value
    if args.upstream:
        dns = [s for s in args.upstream if s.startswith("dns://")]
        if dns:
            overrides["discover"] = dns
        if plain := [parse_upstream(s) for s in args.upstream if not s.startswith("dns://")]:
            overrides["upstreams"] = plain
    if args.fallback_upstream:
        overrides["fallback_upstreams"] = [parse_upstream(s) for s in args.fallback_upstream]
    if args.policy:
        overrides["policy"] = args.policy
    if args.degrade:
        overrides.setdefault("degrade", {})["action"] = args.degrade
    if args.log_requests:
        overrides["log_requests"] = True
    if args.no_stream_resume:
        overrides.setdefault("retry", {})["resume_streams"] = False
    merged = _merge(data, overrides)
    if "otlp_traces_endpoint" not in merged and (endpoint := endpoint_from_env()):
        merged["otlp_traces_endpoint"] = endpoint
    merged.setdefault("otlp_traces_protocol", protocol_from_env())
    return config_from_mapping(merged)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except (OSError, ValueError) as e:
        print(f"surge gateway: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per proxied request
    return run_event_loop(serve(config))
