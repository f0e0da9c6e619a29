"""`surge autoscale` in observe mode: in Kubernetes the cluster starts and stops the replicas, so
the autoscaler only finds them (`--discover dns://NAME:PORT`, `--upstream URL`), scrapes them,
decides as it does locally, and answers KEDA (`--keda-external-scaler-port`) with that decision.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from surge.autoscale.providers.observed import ObservedConfig, ObservedProvider
from surge.http.discovery import DnsTarget


def add_observe_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("observe mode (Kubernetes: the cluster starts the replicas)")
    g.add_argument(
        "--discover",
        default=None,
        metavar="dns://NAME:PORT",
        help="observe the replicas a headless Service's name resolves to (re-resolved before "
        "every decision); starts no replica and no gateway",
    )
    g.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="URL",
        help="observe this replica (repeatable; with or without --discover)",
    )
    g.add_argument(
        "--gateway-url",
        default=None,
        help="observe mode, scaled to zero: the gateway whose held requests make the fleet "
        "active again (its surge_gateway_requests_awaiting_upstream)",
    )
    p.add_argument(
        "--keda-external-scaler-port",
        type=int,
        default=None,
        help="serve KEDA's external-scaler gRPC protocol on this port (needs surge[keda]): "
        "metric surge_desired_replicas = the replicas decided on, target 1",
    )


def observed_provider(
    args: argparse.Namespace, serve_args: Sequence[str]
) -> ObservedProvider | None:
    """The provider of observe mode, or None when the flags ask for the local/Ray one."""
    if args.discover is None and not args.upstream:
        if args.gateway_url is not None:
            raise SystemExit("surge autoscale: --gateway-url is for observe mode (--discover)")
        return None
    if serve_args:
        raise SystemExit("surge autoscale: observe mode starts no replica; drop the -- arguments")
    try:
        target = DnsTarget.parse(args.discover) if args.discover is not None else None
    except ValueError as e:
        raise SystemExit(f"surge autoscale: --discover: {e}") from None
    urls = tuple(u.rstrip("/") for u in args.upstream)
    return ObservedProvider(ObservedConfig(target, urls))
