"""Every query of deploy/grafana/surge.json, and every rule of deploy/prometheus, run in a real
Prometheus (Debian's binary, 1 s scrapes) scraping a real `surge serve` (tiny Llama), a real
`surge gateway` in front of it (with a dead second upstream, so retries, a breaker, shedding and
degradation happen) and a real `surge autoscale` watching it, after a short bounded load.

A query must parse and return at least one series: a panel whose metric does not exist (a typo,
a renamed metric) fails here. The GPU panels cannot have data on a machine without an NVIDIA GPU:
they are named below, with the reason, and must be empty there (and full where there is one)."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.autoscale.processes import AutoscaleProcess
from tests.gateway.processes import GatewayProcess
from tests.observability.prom_process import PrometheusProcess
from tests.observability.prometheus_bin import binary
from tests.servers import ServerProcess, free_port

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/surge.json"
RULES = [
    ROOT / "deploy/prometheus/recording.rules.yml",
    ROOT / "deploy/prometheus/alerts.rules.yml",
]
HAS_GPU = Path("/proc/driver/nvidia/gpus").is_dir()
# panel title -> why it has no data on this machine
EXPECTED_EMPTY = {} if HAS_GPU else {
    "GPU memory": "no NVIDIA GPU here: the NVML gauges are not exported on a CPU machine",
    "GPU utilization": "no NVIDIA GPU here: the NVML gauges are not exported on a CPU machine",
}  # fmt: skip
RATE_INTERVAL = "30s"  # what Grafana's $__rate_interval stands for in these queries


def panels() -> list[dict[str, Any]]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def test_dashboard_json_is_what_build_py_writes() -> None:
    sys.path.insert(0, str(DASHBOARD.parent))
    try:
        import build  # deploy/grafana/build.py
    finally:
        sys.path.remove(str(DASHBOARD.parent))
    assert DASHBOARD.read_text() == build.render(), "run python deploy/grafana/build.py"
    titles = [p["title"] for p in panels()]
    assert len(titles) == len(set(titles))
    assert set(EXPECTED_EMPTY) <= set(titles)
    for p in panels():
        for t in p["targets"]:
            # A fallback would hide a missing metric from the test below.
            assert "vector(" not in t["expr"] and "absent(" not in t["expr"], t["expr"]


def _load(gateway_url: str, seconds: float, clients: int = 4) -> int:
    """Back-to-back short completions through the gateway from two tenants at two priorities;
    refusals (shed, 503) are part of the picture. Returns the requests answered 200."""
    ok = [0] * clients
    deadline = time.monotonic() + seconds

    def client(i: int) -> None:
        headers = {"x-surge-tenant": f"tenant-{'ab'[i % 2]}", "x-surge-priority": str(i % 2)}
        body = {"model": "test-model", "prompt": f"Client {i} says", "max_tokens": 12,
                "ignore_eos": True, "stream": i == 0}  # fmt: skip
        with httpx.Client(timeout=60) as http:
            while time.monotonic() < deadline:
                r = http.post(gateway_url + "/v1/completions", json=body, headers=headers)
                ok[i] += r.status_code == 200

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return sum(ok)


@pytest.fixture
def fleet(tiny_server: ServerProcess, tmp_path: Path) -> Iterator[PrometheusProcess]:
    promtool_dir = binary("prometheus")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connect errors, a breaker
    gateway = GatewayProcess(
        "--upstream", tiny_server.url, "--upstream", dead, "--policy", "round_robin",
        "--health-interval", "0", "--breaker-failures", "1", "--breaker-open", "2",
        "--max-concurrency", "3", "--max-queue", "0", "--degrade", "cap_max_tokens",
        "--max-in-flight-per-upstream", "1",
    )  # fmt: skip
    # Observe mode, exporting its decisions on --metrics-port.
    autoscaler = AutoscaleProcess(
        tmp_path / "autoscale.log", "--upstream", tiny_server.url, "--interval", "0.5",
        "--forecast-horizon", "5", "--max-replicas", "3",
    )  # fmt: skip
    prom = None
    try:
        gateway.wait_ready()
        prom = PrometheusProcess(promtool_dir, tmp_path, {
            "surge": f"127.0.0.1:{tiny_server.port}",
            "gateway": f"127.0.0.1:{gateway.port}",
            "autoscaler": f"127.0.0.1:{autoscaler.metrics_port}",
        }, RULES)  # fmt: skip
        prom.wait(lambda: len(prom.query("up == 1")) == 3, 60, "all three targets up")
        prom.gateway_url = gateway.url  # type: ignore[attr-defined]
        yield prom
    finally:
        if prom is not None:
            prom.stop()
        assert autoscaler.stop() == 0, autoscaler.log()
        gateway.stop()


def _values(prom: PrometheusProcess, query: str, subst: dict[str, str]) -> list[str]:
    """A template variable's values: Grafana's label_values(selector, label), asked of the
    same Prometheus."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
    assert m, query
    series = prom.api("series", **{"match[]": _substitute(m[1], subst)})
    return sorted({s[m[2]] for s in series if m[2] in s})


def _regex_value(value: str) -> str:
    """As Grafana writes a multi-value variable into a PromQL regex: metacharacters escaped with
    a backslash that the PromQL string itself escapes (so `.` becomes `\\\\.`)."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value)


def _substitute(expr: str, subst: dict[str, str]) -> str:
    for name, value in sorted(subst.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace("$" + name, value)
    return expr


def test_every_panel_and_rule_has_data_in_a_real_prometheus(
    fleet: PrometheusProcess,
) -> None:
    prom, started = fleet, time.monotonic()
    answered = _load(prom.gateway_url, seconds=6.0)  # type: ignore[attr-defined]
    assert answered > 0
    time.sleep(2.5)  # the last scrapes and rule evaluations

    subst = {"__rate_interval": RATE_INTERVAL}
    for var in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if var["type"] == "query":
            values = _values(prom, var["query"]["query"], subst)
            assert values, f"template variable ${var['name']} has no values"
            subst[var["name"]] = "(" + "|".join(map(_regex_value, values)) + ")"
    assert subst["model"] == "(test-model)"

    empty, failures = [], []
    for p in panels():
        for t in p["targets"]:
            result = prom.query(_substitute(t["expr"], subst))
            if p["title"] in EXPECTED_EMPTY:
                empty.append(bool(result))
            elif not result:
                failures.append(f"{p['title']}: {t['expr']}")
    assert not failures, "queries with no data:\n" + "\n".join(failures)
    assert not any(empty), f"expected empty on this machine but has data: {EXPECTED_EMPTY}"

    # Figures that must move under the load, not only exist.
    assert prom.query("sum(rate(vllm:generation_tokens_total[30s])) > 0")
    assert prom.query(
        "max(surge_gateway_breaker_state) == 2 or max(surge_gateway_retries_total) > 0"
    )
    assert prom.query("sum(surge_gateway_shed_requests_total) > 0")

    # The rules: all evaluate without error, and every recording rule made series.
    rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert len(rules) == 45, len(rules)
    bad = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
    assert not bad, bad
    missing = [r["name"] for r in rules if r["type"] == "recording" and not prom.query(r["name"])]
    assert not missing, f"recording rules with no series: {missing}"
    print(f"real-Prometheus check: {time.monotonic() - started:.1f} s after the fleet was up")
