"""KEDA's external-scaler gRPC service, answering with the autoscaler's own decision.

KEDA asks two things: whether the workload should run at all (IsActive / StreamIsActive: scale
between 0 and 1) and a metric for the HPA it drives (GetMetricSpec / GetMetrics: 1 to N). The
metric is the replica count this autoscaler decided on (signals, forecast and stabilization, as
it decides for a local fleet) with a target of 1 per replica, so the HPA's
ceil(value / target) is exactly that count.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc

from surge.autoscale.keda import externalscaler_pb2 as pb
from surge.autoscale.keda import externalscaler_pb2_grpc as pb_grpc
from surge.autoscale.keda.board import Board, View

METRIC = "surge_desired_replicas"
log = logging.getLogger(__name__)


class ExternalScaler(pb_grpc.ExternalScalerServicer):
    def __init__(self, board: Board, first_decision_timeout_s: float) -> None:
        self.board = board
        self.timeout_s = first_decision_timeout_s

    async def _view(self, context: grpc.aio.ServicerContext) -> View:
        view = await self.board.wait(self.timeout_s)
        if view is None:  # KEDA keeps the current scale and asks again
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no scaling decision yet")
        assert view is not None
        return view

    async def IsActive(  # KEDA's method names
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        return pb.IsActiveResponse(result=(await self._view(context)).active)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """The current answer at once, then each change (KEDA scales from zero on a push)."""
        view = await self._view(context)
        sent: bool | None = None
        while True:
            if view.active != sent:
                sent = view.active
                yield pb.IsActiveResponse(result=sent)
            view = await self.board.next()

    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        spec = pb.MetricSpec(metricName=METRIC, targetSize=1, targetSizeFloat=1.0)
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        desired = (await self._view(context)).desired
        # Echo the name KEDA asks with (it may carry KEDA's own prefix).
        value = pb.MetricValue(
            metricName=request.metricName or METRIC,
            metricValue=desired,
            metricValueFloat=float(desired),
        )
        return pb.GetMetricsResponse(metricValues=[value])


async def start_server(
    board: Board, host: str, port: int, first_decision_timeout_s: float = 10.0
) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(
        ExternalScaler(board, first_decision_timeout_s), server
    )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if server.add_insecure_port(address) == 0:
        raise RuntimeError(f"KEDA external scaler: cannot listen on {address}")
    await server.start()
    log.info("KEDA external scaler on %s (metric %s, target 1)", address, METRIC)
    return server
