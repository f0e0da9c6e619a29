"""The gateway's endpoint picker on gRPC: Envoy's ExternalProcessor (one Flow per stream) and
gRPC health checking with GIE's service names, on the gateway's event loop and over its pool.

Health (GIE's EPP protocol): `liveness` serves while the process answers; `readiness` and
`envoy.service.ext_proc.v3.ExternalProcessor` (and "", the server as a whole) serve until the
gateway drains, then read NOT_SERVING, so that the data plane's health checks move it out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

from surge.gateway.config import GatewayConfig
from surge.gateway.epp.flow import Flow
from surge.gateway.epp.picker import Picker
from surge.gateway.epp.proto import external_processor_pb2 as pb
from surge.gateway.epp.proto import external_processor_pb2_grpc as pb_grpc
from surge.gateway.epp.proto import health_pb2 as hpb
from surge.gateway.epp.proto import health_pb2_grpc as hpb_grpc
from surge.gateway.metrics import OVERHEAD_BUCKETS

log = logging.getLogger(__name__)

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READY_SERVICES = ("", "readiness", EXT_PROC_SERVICE)
SERVING = hpb.HealthCheckResponse.SERVING
NOT_SERVING = hpb.HealthCheckResponse.NOT_SERVING


class EppMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "surge_epp_decisions",
            "Endpoint-picker decisions, by result (routed, "
            "sheddable_shed, saturated, no_healthy_upstream, subset_empty, model_not_found).",
            ["result"],
            registry=registry,
        )
        self.decision_time = Histogram(
            "surge_epp_decision_seconds",
            "Time to pick an endpoint once the request's body is in (parse, hash, balance).",
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.streams = Counter(
            "surge_epp_streams",
            "ext_proc streams, by how they ended (ok, cancelled, error).",
            ["end"],
            registry=registry,
        )

    def observe(self, seconds: float, result: str) -> None:
        self.decisions.labels(result).inc()
        self.decision_time.observe(seconds)


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, picker: Picker, config: GatewayConfig, metrics: EppMetrics) -> None:
        self.picker = picker
        self.config = config
        self.metrics = metrics

    async def Process(  # Envoy's method name
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        flow = Flow(self.picker, self.config, on_decision=self.metrics.observe)
        end = "cancelled"
        try:
            async for msg in request_iterator:
                for out in flow.handle(msg):
                    yield out
            end = "ok"
        except Exception:
            end = "error"
            log.exception("ext_proc stream failed")
            raise
        finally:
            flow.close()
            self.metrics.streams.labels(end).inc()


class Health(hpb_grpc.HealthServicer):
    def __init__(self, ready: Callable[[], bool]) -> None:
        self.ready = ready

    def status(self, service: str) -> hpb.HealthCheckResponse.ServingStatus | None:
        if service == "liveness":
            return SERVING
        if service in READY_SERVICES:
            return SERVING if self.ready() else NOT_SERVING
        return None

    async def Check(
        self, request: hpb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> hpb.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return hpb.HealthCheckResponse(status=status)

    async def Watch(
        self, request: hpb.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[hpb.HealthCheckResponse]:
        """The status now, then each change (read twice a second)."""
        sent: hpb.HealthCheckResponse.ServingStatus | None = None
        while True:
            status = self.status(request.service)
            status = hpb.HealthCheckResponse.SERVICE_UNKNOWN if status is None else status
            if status != sent:
                sent = status
                yield hpb.HealthCheckResponse(status=status)
            await asyncio.sleep(0.5)


async def start_server(
    picker: Picker,
    config: GatewayConfig,
    metrics: EppMetrics,
    ready: Callable[[], bool],
) -> grpc.aio.Server:
    """Serve on config.host:config.epp.port until stopped; raises OSError if it cannot bind."""
    assert config.epp.port is not None
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(
        ExternalProcessor(picker, config, metrics), server
    )
    hpb_grpc.add_HealthServicer_to_server(Health(ready), server)
    host = f"[{config.host}]" if ":" in config.host else config.host
    address = f"{host}:{config.epp.port}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot bind the ext_proc port {address}")
    await server.start()
    log.info("endpoint picker (Envoy ext_proc) on %s", address)
    return server
