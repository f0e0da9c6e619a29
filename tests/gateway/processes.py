"""`surge gateway` as a real subprocess on a free 127.0.0.1 port, stopped by its PID."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import free_port, log_dir, stop_process


class GatewayProcess:
    def __init__(self, *args: str, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Named apart from later processes given the same port (their logs would overwrite).
        self.log_path = log_dir() / f"surge-gateway-{self.port}-{time.time_ns()}.log"
        self._log = self.log_path.open("wb")
        data = self.log_path.with_suffix(".batch")  # its Batch API's state (a later flag wins)
        cmd = [sys.executable, "-m", "surge.cli", "gateway", "--port", str(self.port),
               "--data-dir", str(data), *args]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 60.0, num_upstreams: int | None = None) -> None:
        """Until it answers, and (if given) has that many upstreams in rotation."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited early:\n{self.log()}")
            try:
                health = httpx.get(self.url + "/health", timeout=2).json()
                if num_upstreams is None or health["upstreams_in_rotation"] == num_upstreams:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway not ready in {timeout_s}s:\n{self.log()}")

    def health(self) -> dict[str, object]:
        body: dict[str, object] = httpx.get(self.url + "/health", timeout=5).json()
        return body

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    def samples(self, name: str, **labels: str) -> list[float]:
        """The values of metric `name`'s samples carrying these labels."""
        return [
            s.value
            for family in text_string_to_metric_families(self.metrics())
            for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()
        ]

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, timeout_s: float = 15.0) -> int:
        code = stop_process(self.proc, timeout_s)
        self._log.close()
        return code
