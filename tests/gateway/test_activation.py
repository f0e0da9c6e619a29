"""Scaled to zero: a gateway with no upstream at all holds requests for a while (counted in
surge_gateway_requests_awaiting_upstream, what wakes an autoscaler), serves them if an upstream
appears, else answers 503 with Retry-After. A real gateway process and a real server."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx

from tests.gateway.processes import GatewayProcess
from tests.servers import ServerProcess

BODY = {"model": "test-model", "prompt": "hi", "max_tokens": 2}


def _awaiting(gw: GatewayProcess) -> float:
    for line in gw.metrics().splitlines():
        if line.startswith("surge_gateway_requests_awaiting_upstream "):
            return float(line.split()[1])
    raise AssertionError("no awaiting gauge")


def test_requests_wait_for_an_upstream_to_appear(
    tmp_path: Path, tiny_server: ServerProcess
) -> None:
    upstreams = tmp_path / "upstreams.json"
    upstreams.write_text(json.dumps({"upstreams": []}))
    gw = GatewayProcess("--upstreams-file", str(upstreams), "--reload-interval", "0.2",
                        "--activation-timeout", "20", "--health-interval", "0")  # fmt: skip
    try:
        gw.wait_ready()
        health = httpx.get(gw.url + "/health", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "scaled_to_zero"
        answers: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: answers.append(
                httpx.post(gw.url + "/v1/completions", json=BODY, timeout=60)
            )
        )
        sender.start()
        deadline = time.monotonic() + 10
        while _awaiting(gw) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _awaiting(gw) == 1 and not answers  # held, and seen
        upstreams.write_text(json.dumps({"upstreams": [tiny_server.url]}))  # "started"
        sender.join(30)
        (resp,) = answers
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 2
        assert _awaiting(gw) == 0
    finally:
        gw.stop()


def test_with_no_upstream_in_time_the_answer_is_503_with_retry_after(tmp_path: Path) -> None:
    upstreams = tmp_path / "upstreams.json"
    upstreams.write_text(json.dumps({"upstreams": []}))
    gw = GatewayProcess("--upstreams-file", str(upstreams), "--activation-timeout", "1.5")
    try:
        gw.wait_ready()
        t0 = time.monotonic()
        resp = httpx.post(gw.url + "/v1/completions", json=BODY, timeout=30)
        waited = time.monotonic() - t0
        assert resp.status_code == 503 and "retry-after" in resp.headers
        assert resp.json()["error"]["code"] == "no_healthy_upstream"
        assert 1.4 <= waited < 10
    finally:
        gw.stop()
