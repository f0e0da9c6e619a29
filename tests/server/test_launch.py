"""Process lifecycle: SIGTERM drains in-flight work; an engine crash fails requests and exits 1."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil

from tests.servers import ServerProcess


def test_sigterm_drains_in_flight_then_exits_zero(tiny_model_dir: Path) -> None:
    server = ServerProcess(tiny_model_dir, "--drain-timeout", "60", "--api-niceness", "5")
    try:
        _drain_and_check(server)
    finally:
        server.stop()


def _drain_and_check(server: ServerProcess) -> None:
    engine = psutil.Process(server.engine_pid())
    # --api-niceness: the API process gave up CPU priority once the engine had started; the
    # engine kept its own.
    base = os.nice(0)
    assert psutil.Process(server.proc.pid).nice() == min(base + 5, 19)
    assert engine.nice() == base
    result: dict[str, object] = {}

    def stream() -> None:
        body = {
            "prompt": "Go on", "max_tokens": 1900, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            result["lines"] = [ln for ln in r.iter_lines() if ln.startswith("data: ")]

    t = threading.Thread(target=stream)
    t.start()
    while server.metric("vllm:num_requests_running") < 1:
        time.sleep(0.05)  # the stream is running
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
    assert httpx.get(server.url + "/health").status_code == 503
    t.join(120)
    lines = result["lines"]
    assert isinstance(lines, list) and lines[-1] == "data: [DONE]"
    assert '"completion_tokens":1900' in lines[-2].replace(" ", "")  # completed in full
    assert server.proc.wait(30) == 0
    engine.wait(10)  # no orphan engine process
    assert not engine.is_running()


def test_engine_crash_fails_requests_and_exits_nonzero(tiny_model_dir: Path) -> None:
    server = ServerProcess(tiny_model_dir)
    try:
        _crash_and_check(server)
    finally:
        server.stop()


def _crash_and_check(server: ServerProcess) -> None:
    result: dict[str, object] = {}

    def long_request() -> None:
        body = {"prompt": "Go on", "max_tokens": 1900, "ignore_eos": True}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        result["status"] = r.status_code
        result["body"] = r.json()

    t = threading.Thread(target=long_request)
    t.start()
    while server.metric("vllm:num_requests_running") < 1:
        time.sleep(0.05)
    os.kill(server.engine_pid(), signal.SIGKILL)
    t.join(60)
    assert result["status"] == 503
    assert "engine" in result["body"]["error"]["message"]  # type: ignore[index]
    assert server.proc.wait(30) != 0
