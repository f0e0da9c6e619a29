"""The autoscaler's loop with batch work: it scrapes the replicas and the gateway (where fleet
batches run, their lines on the replicas) over HTTP, keeps the lines out of the load, and adds
replicas only once a batch would miss its window. The /metrics answers are the series the Batch
API exports (docs/batch.md), served by HTTP servers on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.controller import Autoscaler
from surge.autoscale.providers.observed import ObservedConfig, ObservedProvider


class MetricsServer:
    """Answers GET /metrics with whatever `text` holds now."""

    def __init__(self) -> None:
        self.text = ""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.text.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("content-type", "text/plain; version=0.0.4")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def servers() -> Iterator[tuple[MetricsServer, MetricsServer]]:
    replica, gateway = MetricsServer(), MetricsServer()
    try:
        yield replica, gateway
    finally:
        replica.close()
        gateway.close()


def gateway_text(pending: int, in_flight: int, window_s: float, per_s: float) -> str:
    return (
        "# TYPE surge:batch_lines gauge\n"
        f'surge:batch_lines{{state="pending"}} {pending}\n'
        f'surge:batch_lines{{state="in_flight"}} {in_flight}\n'
        'surge:batch_lines{state="completed"} 0\n'
        'surge:batch_lines{state="failed"} 0\n'
        "surge:batch_tokens_total 0\n"
        f"surge:batch_window_seconds_left {window_s}\n"
        f"surge:batch_lines_per_second {per_s}\n"
    )


async def test_the_loop_scales_for_a_batch_only_when_it_would_miss_its_window(
    servers: tuple[MetricsServer, MetricsServer],
) -> None:
    replica, gateway = servers
    # 10 sequences on the one replica: 2 interactive requests and 8 of the gateway's lines.
    replica.text = (
        'vllm:num_requests_running{model_name="m"} 10\n'
        'vllm:num_requests_waiting{model_name="m"} 0\n'
    )
    clock = {"now": 0.0}
    config = AutoscalerConfig(
        min_replicas=1,
        max_replicas=20,
        target_ongoing_per_replica=4,
        max_scale_up_step=20,
        forecast_horizon_s=0,
        batch_margin_s=60,
        batch_window_s=10,
    )
    provider = ObservedProvider(ObservedConfig(upstreams=(replica.url,)))
    scaler = Autoscaler(config, provider, clock=lambda: clock["now"])
    scaler.act = False  # observe mode: it decides; the cluster would start the replicas
    async with httpx.AsyncClient() as client:
        # Without the gateway's batch figures the 10 sequences are load: 3 replicas.
        assert await scaler.step(client) == 3
        scaler = Autoscaler(config, provider, clock=lambda: clock["now"])
        scaler.act, scaler.gateway_url = False, gateway.url
        # 400 lines in 2 h at 2 lines/s, 4 s a line: on pace; the interactive 2 need 1 replica.
        gateway.text = gateway_text(400, 8, 7200, 2.0)
        for t in (0.0, 6.0, 12.0):
            clock["now"] = t
            target = await scaler.step(client)
        assert target == 1
        # The same backlog with 5 minutes left: 408 / (300 - 60) = 1.7 lines/s x 4 s = 6.8
        # lines in flight + 2 interactive = 8.8 sequences: 3 replicas, once it has lasted 10 s.
        gateway.text = gateway_text(400, 8, 300, 2.0)
        clock["now"] = 14.0
        assert await scaler.step(client) == 1  # the on-pace want of t=12 is within the window
        clock["now"] = 26.0
        assert await scaler.step(client) == 3
