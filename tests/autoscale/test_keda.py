"""KEDA's side of `surge autoscale --keda-external-scaler-port`: a real gRPC client generated from
the vendored externalscaler.proto, against a real `surge autoscale` in observe mode (it finds the
replica by DNS, `--discover dns://127.0.0.1:PORT`, as in Kubernetes) watching a real tiny-model
`surge serve`. Idle, the answer is 0 replicas and inactive; a load raises it (and the stream
pushes active); when the load ends it falls back. Every process is stopped by its PID."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from tests.autoscale.keda_client import client_modules
from tests.autoscale.processes import AutoscaleProcess
from tests.servers import ServerProcess, free_port

pytestmark = pytest.mark.timeout(240)


def wait_for(
    check: Callable[[], bool], timeout_s: float, what: str, log: Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not seen in {timeout_s}s\n{log()}")


@pytest.fixture(scope="module")
def queued_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """One request at a time, so a burst waits in its queue."""
    server = ServerProcess(tiny_model_dir, "--dtype", "float32", "--max-num-seqs", "1")
    yield server
    server.stop()


def observer_process(server: ServerProcess, log_dir: Path) -> tuple[AutoscaleProcess, int]:
    """`surge autoscale` in observe mode with its KEDA port (the process, the gRPC port)."""
    grpc_port = free_port()
    proc = AutoscaleProcess(
        log_dir / "autoscale-observe.log",
        "--discover", f"dns://127.0.0.1:{server.port}",
        "--keda-external-scaler-port", str(grpc_port),
        "--min-replicas", "0", "--max-replicas", "4", "--interval", "0.2",
        "--target-ongoing", "1", "--target-waiting", "1", "--tolerance", "0",
        "--scale-down-window", "0", "--forecast-horizon", "0",
    )  # fmt: skip
    return proc, grpc_port


def test_keda_external_scaler_answers_with_the_decision(
    queued_server: ServerProcess, tmp_path: Path
) -> None:
    pb, pb_grpc = client_modules(tmp_path / "stubs")
    observer, grpc_port = observer_process(queued_server, tmp_path)
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=60)
        stub: Any = pb_grpc.ExternalScalerStub(channel)
        ref = pb.ScaledObjectRef(name="surge", namespace="default", scalerMetadata={"a": "b"})

        def desired() -> int:
            req = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="surge_desired_replicas")
            (value,) = stub.GetMetrics(req, timeout=15).metricValues
            assert value.metricName == "surge_desired_replicas"
            assert value.metricValue == value.metricValueFloat
            return int(value.metricValue)

        (spec,) = stub.GetMetricSpec(ref, timeout=15).metricSpecs
        assert (spec.metricName, spec.targetSize, spec.targetSizeFloat) == (
            "surge_desired_replicas", 1, 1.0,
        )  # fmt: skip
        # Idle: the replica found by DNS is kept by nothing (min 0, no down window).
        wait_for(lambda: desired() == 0, 30, "desired 0 when idle", observer.log)
        assert stub.IsActive(ref, timeout=15).result is False

        pushed: queue.Queue[bool] = queue.Queue()
        stream = stub.StreamIsActive(ref)

        def read_stream() -> None:
            try:
                for answer in stream:
                    pushed.put(answer.result)
            except grpc.RpcError:
                pass  # cancelled at the end of the test

        reader = threading.Thread(target=read_stream, daemon=True)
        reader.start()
        assert pushed.get(timeout=15) is False  # the current answer at once

        # 4 clients, each sending short requests back to back: 1 runs, 3 wait (--max-num-seqs 1):
        # 4 ongoing at a target of 1 each ask for 4 replicas (the max). Back to back, so the
        # load lasts until the answer is seen, on a fast machine or a slow one.
        client = openai.OpenAI(base_url=queued_server.url + "/v1", api_key="x", max_retries=0)
        stop = threading.Event()

        def one() -> None:
            while not stop.is_set():
                client.completions.create(
                    model="test-model", prompt="Once upon a time", max_tokens=32,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip

        load = [threading.Thread(target=one) for _ in range(4)]
        for t in load:
            t.start()
        try:
            assert pushed.get(timeout=30) is True  # pushed, not polled
            peak = 0

            def risen() -> bool:
                nonlocal peak
                peak = max(peak, desired())
                return peak >= 3

            wait_for(risen, 60, "desired replicas raised by the load", observer.log)
            assert stub.IsActive(ref, timeout=15).result is True
            assert observer.desired_gauge() >= 1  # the same decision on /metrics
        finally:
            stop.set()
            for t in load:
                t.join(120)
        # The load is over: back to zero, and the stream says so.
        wait_for(lambda: desired() == 0, 30, "desired 0 after the load", observer.log)
        assert pushed.get(timeout=15) is False
        stream.cancel()
        reader.join(10)
    finally:
        channel.close()
        code = observer.stop()
    assert code == 0, observer.log()
