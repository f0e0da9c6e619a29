"""ResourceMonitor: samples of named processes (a real child process here, the engine of a real
server), the host, and gauges read at scrape time."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from surge.observability.resources import ResourceMonitor
from tests.servers import ServerProcess

MiB = 1024 * 1024


def _samples(reg: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for f in text_string_to_metric_families(generate_latest(reg).decode()):
        out[f.name] = [(dict(s.labels), s.value) for s in f.samples]
    return out


def test_sample_is_sane() -> None:
    s = ResourceMonitor().sample()
    api = s.process("api")
    assert api is not None and api.rss_bytes > 0 and api.cpu_percent >= 0.0
    assert 0.0 <= s.system_memory_used_ratio <= 1.0
    assert 0.0 <= s.system_cpu_percent <= 100.0
    assert s.cpu_count >= 1
    assert all(g.memory_used_bytes >= 0 for g in s.gpus)


def test_a_named_child_process_is_reported_until_it_exits() -> None:
    code = "b = bytearray(96 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\n" \
           "import time; print('ready', flush=True); time.sleep(60)"  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        monitor = ResourceMonitor({"api": None, "worker": child.pid})
        reg = CollectorRegistry()
        monitor.register(reg)
        rss = dict((labels["process"], v) for labels, v in
                   _samples(reg)["surge:process_resident_memory_bytes"])  # fmt: skip
        assert set(rss) == {"api", "worker"}
        assert rss["worker"] > 96 * MiB  # its touched pages, not ours
        assert abs(rss["worker"] - psutil.Process(child.pid).memory_info().rss) < 16 * MiB
    finally:
        child.kill()
        child.wait(10)
    s = monitor.sample()
    assert s.process("worker") is None and s.process("api") is not None


def test_values_fresh_at_scrape() -> None:
    reg = CollectorRegistry()
    ResourceMonitor().register(reg)

    def rss() -> float:
        (labels, value), = _samples(reg)["surge:process_resident_memory_bytes"]  # fmt: skip
        assert labels == {"process": "api"}
        return value

    # Each scrape reads the process as it is now (within a few pages of psutil's own reading),
    # not a value cached at registration: compare after the process has grown.
    ballast = bytearray(64 * MiB)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1  # touched pages count as resident
    now = psutil.Process().memory_info().rss
    assert abs(rss() - now) < 16 * MiB
    del ballast


def test_gpu_families_have_a_sample_per_device_and_none_without_one() -> None:
    reg = CollectorRegistry()
    monitor = ResourceMonitor()
    monitor.register(reg)
    samples = _samples(reg)
    gpus = monitor.sample().gpus
    used = samples["surge:gpu_memory_used_bytes"]
    assert sorted(labels["gpu"] for labels, _ in used) == [str(g.index) for g in gpus]
    if not gpus:  # this machine: declared, no false zeros
        assert samples["surge:gpu_memory_total_bytes"] == []
        assert samples["surge:gpu_utilization_percent"] == []


def test_register_twice_rejected() -> None:
    reg = CollectorRegistry()
    ResourceMonitor().register(reg)
    with pytest.raises(ValueError, match="Duplicated"):
        ResourceMonitor().register(reg)


def test_a_server_reports_its_engine_process(tiny_server: ServerProcess) -> None:
    """The engine holds the model and the cores: its own gauges, beside the API process's."""
    httpx.post(tiny_server.url + "/v1/completions", timeout=60,
               json={"prompt": "hi", "max_tokens": 4})  # fmt: skip
    time.sleep(0.2)
    engine = psutil.Process(tiny_server.engine_pid())
    before = engine.memory_info().rss
    text = httpx.get(tiny_server.url + "/metrics", timeout=10).text
    after = engine.memory_info().rss  # the engine may still be building its KV pool's pages
    families = {f.name: f for f in text_string_to_metric_families(text)}
    rss = {
        s.labels["process"]: s.value
        for s in families["surge:process_resident_memory_bytes"].samples
    }
    assert set(rss) == {"api", "engine"}
    assert min(before, after) - 32 * MiB <= rss["engine"] <= max(before, after) + 32 * MiB
    assert rss["api"] == pytest.approx(
        psutil.Process(tiny_server.proc.pid).memory_info().rss, abs=32 * MiB
    )
    (host,) = families["surge:system_cpu_percent"].samples
    assert 0.0 <= host.value <= 100.0
