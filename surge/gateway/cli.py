"""`surge gateway ...`: argparse (over an optional --config file) -> GatewayConfig -> serve."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping
from typing import Any

from surge.config.flags import add_config_args, overrides_from_args
from surge.gateway.config import DegradeAction, GatewayConfig, Policy
from surge.gateway.config_file import config_from_mapping, read_mapping
from surge.gateway.launch import serve
from surge.http.event_loop import run as run_event_loop
from surge.observability.tracing import endpoint_from_env, protocol_from_env

# The flags of GatewayConfig's fields (their metadata, surge/config/flags.py) default to None,
# meaning "not given": then the config file's value, else the dataclass default, holds.
GATEWAY_GROUP = "gateway"


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
    p.add_argument("--log-level", default="INFO")
    add_config_args(p, GatewayConfig, GATEWAY_GROUP, unset=True)
    return p


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
    overrides = overrides_from_args(GatewayConfig, args)
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
