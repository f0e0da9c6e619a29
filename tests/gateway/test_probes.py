"""Kubernetes probes on a real `surge gateway`: ready only with an upstream in rotation (or the
scale-to-zero hold on), live while it answers, and a SIGTERM drain that keeps both answering
(ready 503, live 200) while a stream through it finishes whole."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx

from tests.gateway.processes import GatewayProcess
from tests.servers import ServerProcess, free_port


def _get(gw: GatewayProcess, path: str) -> tuple[int, dict[str, object]]:
    r = httpx.get(gw.url + path, timeout=5)
    return r.status_code, r.json()


def _wait_for(gw: GatewayProcess, path: str, status: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while _get(gw, path)[0] != status:
        assert time.monotonic() < deadline, f"{path} never {status}:\n{gw.log()}"
        time.sleep(0.05)


def test_not_ready_without_an_upstream_in_rotation() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gw = GatewayProcess("--upstream", dead, "--health-interval", "0.1",
                        "--unhealthy-threshold", "1")  # fmt: skip
    try:
        gw.wait_ready()
        _wait_for(gw, "/health/ready", 503)
        code, body = _get(gw, "/health/ready")
        assert (code, body["reason"]) == (503, "no upstream in rotation")
        assert body["upstreams_in_rotation"] == 0
        assert _get(gw, "/health/live")[0] == 200  # nothing to restart: the upstreams are down
        assert _get(gw, "/health/startup")[0] == 200
    finally:
        gw.stop()


def test_ready_when_scaled_to_zero_with_the_activation_hold(tmp_path: Path) -> None:
    upstreams = tmp_path / "upstreams.txt"
    upstreams.write_text("")
    gw = GatewayProcess("--upstreams-file", str(upstreams), "--activation-timeout", "30")
    try:
        gw.wait_ready()
        code, body = _get(gw, "/health/ready")
        assert (code, body["status"]) == (200, "activation_hold")  # it must get the traffic
    finally:
        gw.stop()


def test_probes_through_a_drain(tiny_server: ServerProcess) -> None:
    gw = GatewayProcess("--upstream", tiny_server.url, "--drain-timeout", "600",
                        "--health-interval", "0.2")  # fmt: skip
    try:
        gw.wait_ready(num_upstreams=1)
        assert _get(gw, "/health/ready")[0] == 200 and _get(gw, "/health/live")[0] == 200
        _drain_and_check(gw)
    finally:
        gw.stop()


def _drain_and_check(gw: GatewayProcess) -> None:
    result: dict[str, object] = {}
    first = threading.Event()

    def stream() -> None:
        body = {"model": "test-model", "prompt": "Go on", "max_tokens": 400, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        lines = []
        with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                first.set()
                lines.append(line)
        result["lines"] = [ln for ln in lines if ln.startswith("data: ")]

    t = threading.Thread(target=stream)
    t.start()
    assert first.wait(120), gw.log()
    gw.proc.send_signal(signal.SIGTERM)
    _wait_for(gw, "/health/ready", 503, timeout_s=10)
    assert t.is_alive(), "the stream must still be running for the checks below to mean much"
    assert _get(gw, "/health/ready")[1]["reason"] == "draining"
    assert _get(gw, "/health/live") == (200, {"status": "ok", "draining": True})
    refused = httpx.post(gw.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    t.join(600)
    lines = result.get("lines")
    assert isinstance(lines, list) and lines[-1] == "data: [DONE]", gw.log()
    assert '"completion_tokens":400' in lines[-2].replace(" ", "")  # completed in full
    assert gw.proc.wait(30) == 0
