"""ResourceMonitor: sane samples, and gauges read at scrape time."""

from __future__ import annotations

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from surge.observability.resources import ResourceMonitor


def test_sample_is_sane() -> None:
    s = ResourceMonitor().sample()
    assert s.rss_bytes > 0
    assert 0.0 <= s.system_memory_used_ratio <= 1.0
    assert s.cpu_percent >= 0.0
    assert s.cpu_count >= 1
    assert s.gpu_memory_bytes is None or s.gpu_memory_bytes >= 0


def test_gauges_rendered() -> None:
    reg = CollectorRegistry()
    ResourceMonitor().register(reg)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    rss = families["surge:process_resident_memory_bytes"].samples
    assert len(rss) == 1 and rss[0].value > 0
    ratio = families["surge:system_memory_used_ratio"].samples[0].value
    assert 0.0 <= ratio <= 1.0
    assert families["surge:process_cpu_percent"].samples[0].value >= 0.0
    assert families["surge:gpu_memory_used_bytes"].type == "gauge"
    for s in families["surge:gpu_memory_used_bytes"].samples:
        assert s.value >= 0


def test_values_fresh_at_scrape() -> None:
    reg = CollectorRegistry()
    ResourceMonitor().register(reg)

    def rss() -> float:
        for f in text_string_to_metric_families(generate_latest(reg).decode()):
            if f.name == "surge:process_resident_memory_bytes":
                return f.samples[0].value
        raise AssertionError("missing")

    # Each scrape reads the process as it is now (within a few pages of psutil's own reading),
    # not a value cached at registration: compare after the process has grown.
    ballast = bytearray(64 * 1024 * 1024)
    for i in range(0, len(ballast), 4096):
        ballast[i] = 1  # touched pages count as resident
    now = psutil.Process().memory_info().rss
    assert abs(rss() - now) < 16 * 1024 * 1024
    del ballast


def test_register_twice_rejected() -> None:
    reg = CollectorRegistry()
    ResourceMonitor().register(reg)
    with pytest.raises(ValueError, match="Duplicated"):
        ResourceMonitor().register(reg)
