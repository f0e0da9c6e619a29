"""`surge autoscale` as a real subprocess with its --metrics-port, stopped by its PID."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.servers import free_port, stop_process


class AutoscaleProcess:
    def __init__(self, log_path: Path, *args: str) -> None:
        self.metrics_port = free_port()
        self.log_path = log_path
        self._log = log_path.open("wb")
        cmd = [sys.executable, "-m", "surge.cli", "autoscale",
               "--metrics-port", str(self.metrics_port), *args]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def desired_gauge(self) -> float:
        """The replicas it decided on, as its /metrics says."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        line = next(x for x in text.splitlines() if x.startswith("surge_autoscaler_desired"))
        return float(line.split()[-1])

    def stop(self) -> int:
        code = stop_process(self.proc, 20)
        self._log.close()
        return code
