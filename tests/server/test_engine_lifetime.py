"""The engine process never outlives the API process: killed outright or stopped while the engine
still loads (the autoscaler stopping a starting replica), the engine ends at once, not when its
load ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.servers import free_port, log_dir


def _engine_child(api: subprocess.Popen[bytes], timeout_s: float = 60.0) -> psutil.Process:
    """The spawned engine-core process (not multiprocessing's resource tracker)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(api.pid).children():
            try:
                if "spawn_main" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        assert api.poll() is None, "the server exited before spawning its engine"
        time.sleep(0.05)
    raise AssertionError("no engine process appeared")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_engine_dies_with_the_api_process(tiny_model_dir: Path, sig: signal.Signals) -> None:
    log = (log_dir() / f"surge-lifetime-{time.time_ns()}.log").open("wb")
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--model", str(tiny_model_dir),
           "--port", str(free_port()), "--kv-cache-memory-gib", "0.25"]  # fmt: skip
    api = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        engine = _engine_child(api)
        api.send_signal(sig)  # the engine is importing torch or loading: far from ready
        api.wait(timeout=30)
        _, alive = psutil.wait_procs([engine], timeout=10)
        assert not alive, f"engine {engine.pid} outlived the API process ({sig.name})"
    finally:
        for p in [api]:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.close()
