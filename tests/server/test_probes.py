"""Kubernetes probes on a real `surge serve`: live, ready and startup before and through a SIGTERM
drain (ready 503, live 200, the request in flight finishes whole), without an API key."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx

from tests.servers import ServerProcess

KEY = "sk-probe-test"


def _status(url: str) -> tuple[int, dict[str, object]]:
    r = httpx.get(url, timeout=5)  # no Authorization: kubelet sends none
    return r.status_code, r.json()


def test_probes_through_a_drain(tiny_model_dir: Path) -> None:
    server = ServerProcess(tiny_model_dir, "--drain-timeout", "600", "--api-key", KEY)
    try:
        _check(server)
    finally:
        server.stop()


def _check(server: ServerProcess) -> None:
    for path in ("/health", "/health/live", "/health/ready", "/health/startup"):
        assert _status(server.url + path)[0] == 200, path
    result: dict[str, object] = {}

    def stream() -> None:
        body = {"prompt": "Go on", "max_tokens": 400, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        headers = {"authorization": f"Bearer {KEY}"}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=headers,
                          timeout=600) as r:  # fmt: skip
            result["lines"] = [ln for ln in r.iter_lines() if ln.startswith("data: ")]

    t = threading.Thread(target=stream)
    t.start()
    while server.metric("vllm:num_requests_running") < 1:
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _status(server.url + "/health/ready")[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert t.is_alive(), "the stream must still be running for the checks below to mean much"
    code, body = _status(server.url + "/health/ready")
    assert (code, body["reason"]) == (503, "draining")
    code, body = _status(server.url + "/health/live")
    assert (code, body["draining"]) == (200, True)  # a liveness probe must not kill a drain
    assert _status(server.url + "/health/startup")[0] == 200
    assert _status(server.url + "/health")[0] == 503  # as before
    t.join(600)
    lines = result.get("lines")
    assert isinstance(lines, list) and lines[-1] == "data: [DONE]", server.log()
    assert '"completion_tokens":400' in lines[-2].replace(" ", "")  # completed in full
    assert server.proc.wait(30) == 0
