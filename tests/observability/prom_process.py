"""A real Prometheus (Debian's binary) on 127.0.0.1: a free port, a temporary data folder, a 1 s
scrape and rule interval; started by a test and stopped by its PID."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.observability.prometheus_bin import binary
from tests.servers import free_port, stop_process


class PrometheusProcess:
    def __init__(
        self, binary: str, folder: Path, targets: dict[str, str], rule_files: list[Path]
    ) -> None:
        """`targets`: job name -> host:port of its /metrics."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                       "scrape_timeout": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": [where]}]}
                for job, where in targets.items()
            ],
        }  # fmt: skip
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = folder / "prometheus.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.wait(lambda: self._get("/-/ready") == 200, 60, "Prometheus ready")

    def _get(self, path: str) -> int:
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{self.log()}")
        try:
            return httpx.get(self.url + path, timeout=2).status_code
        except httpx.HTTPError:
            return 0

    def wait(self, check: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.2)
        raise AssertionError(f"{what}: not in {timeout_s}s\n{self.log()}")

    def api(self, path: str, **params: str) -> Any:
        body = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` gives now (a parse error fails here)."""
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        assert body["status"] == "success", f"{expr}: {body.get('error')}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_process(self.proc, 20)
        self._log.close()


def prometheus_holding_counter(
    folder: Path, series: str, samples: Iterable[tuple[float, float]]
) -> PrometheusProcess:
    """A real Prometheus whose storage already holds a counter's past: `series` is
    `name_total{labels}`, `samples` its (unix time, value) points, made into TSDB blocks by
    `promtool tsdb create-blocks-from openmetrics` (history no scrape could give)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = series.split("{", 1)[0].removesuffix("_total")
    lines = [f"# TYPE {name} counter"]
    lines += [f"{series} {value:.6f} {t:.3f}" for t, value in samples]
    lines.append("# EOF")
    (folder / "history.om").write_text("\n".join(lines) + "\n")
    subprocess.run(
        [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", "--quiet",
         str(folder / "history.om"), str(folder / "data")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return PrometheusProcess(binary("prometheus"), folder, {}, [])
