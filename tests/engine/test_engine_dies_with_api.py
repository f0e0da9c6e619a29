"""An engine still loading stops at once when its API process goes (issue #45: a `surge serve`
sent SIGTERM in its first seconds exited, and its engine ran on, orphaned, until its load ended;
an autoscaler stopping a starting replica left such engines behind)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.servers import free_port, log_dir


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_an_engine_loading_stops_when_its_api_process_dies(
    tiny_model_dir: Path, sig: signal.Signals
) -> None:
    port = free_port()
    log = log_dir() / f"surge-orphan-{port}-{time.time_ns()}.log"
    cmd = [
        sys.executable, "-m", "surge.cli", "serve", "--model", str(tiny_model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--kv-cache-memory-gib", "0.25",
        "--data-dir", str(log.with_suffix(".batch")),
    ]  # fmt: skip
    with log.open("wb") as out:
        api = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        engine: psutil.Process | None = None
        try:
            engine = _engine_once_spawned(api, timeout_s=30)
            # Still starting: the engine has torch and the model ahead of it (seconds).
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5)
            api.send_signal(sig)
            api.wait(10)
            started = time.monotonic()
            engine.wait(5)  # psutil.TimeoutExpired where it runs on
            assert time.monotonic() - started < 5
            assert not engine.is_running()
        finally:  # what a failure left running, by its PID
            if api.poll() is None:
                api.kill()
                api.wait(10)
            if engine is not None and engine.is_running():
                engine.kill()
                engine.wait(10)


def _engine_once_spawned(api: subprocess.Popen[bytes], timeout_s: float) -> psutil.Process:
    """The API process's engine child (multiprocessing's spawn_main), as soon as it exists."""
    parent = psutil.Process(api.pid)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert api.poll() is None, "surge serve exited before spawning its engine"
        for child in parent.children():
            try:
                if "spawn_main" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.02)
    raise AssertionError(f"no engine process within {timeout_s} s")
