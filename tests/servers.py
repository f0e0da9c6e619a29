"""Real `surge serve` processes on 127.0.0.1, started by tests and stopped by their PID."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def free_port() -> int:
    """A free 127.0.0.1 port below the kernel's ephemeral range. A port the kernel hands out for
    bind(0) comes from that range, which outgoing connections also draw from: a server's own
    health checks once took the port its test had picked before it bound it."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def wait_for(cond: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Polls `cond` every 0.1 s until it holds or `timeout_s` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """SIGTERM, up to `timeout_s` for it to exit (a drain), then SIGKILL; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float) -> str | None:
    """Poll `url`/health until it answers 200: None, or why not ("exited early", or not ready
    in time; the process is left running for the caller to stop)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited early (code {proc.returncode})"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return f"not ready in {timeout_s}s"


def log_dir() -> Path:
    """Where test processes write their logs: the session's pytest temp directory (set by
    tests/conftest.py; pytest keeps the last three sessions' and removes older ones), else
    $TMPDIR or /tmp (a benchmark or a shell using these helpers)."""
    path = Path(os.environ.get("SURGE_TEST_LOG_DIR") or os.environ.get("TMPDIR", "/tmp"))
    path.mkdir(parents=True, exist_ok=True)
    return path


class ServerProcess:
    def __init__(
        self,
        model: Path | str,
        *args: str,
        startup_timeout_s: float = 180.0,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        # Named apart from later processes given the same port (their logs would overwrite).
        self.log_path = log_dir() / f"surge-test-{self.port}-{time.time_ns()}.log"
        self._log = self.log_path.open("wb")
        # The Batch API's state beside the log, not in the user's state folder (a test's own
        # --data-dir, later in `args`, wins).
        data = self.log_path.with_suffix(".batch")
        cmd = [
            sys.executable, "-m", "surge.cli", "serve", "--model", str(model),
            "--host", host, "--port", str(self.port), "--served-model-name", "test-model",
            "--kv-cache-memory-gib", "0.25", "--data-dir", str(data), *args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready(startup_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        why = wait_healthy(self.proc, self.url, timeout_s)
        if why is None:
            return
        if self.proc.poll() is None:
            self.stop()
        raise RuntimeError(f"server {why}:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:  # stop() closes it; a failed start reads it after
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def engine_pid(self) -> int:
        import psutil

        # The engine is the spawned child (not multiprocessing's resource tracker).
        children = psutil.Process(self.proc.pid).children()
        return next(c.pid for c in children if "spawn_main" in " ".join(c.cmdline()))

    def metric(self, name: str, **labels: str) -> float:
        """The first sample of `name` whose labels include `labels`."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return float(sample.value)
        raise KeyError(f"{name} {labels}")

    def stop(self, timeout_s: float = 30.0) -> int:
        code = stop_process(self.proc, timeout_s)
        self._log.close()
        return code
