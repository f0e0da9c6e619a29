"""Process and host resource gauges, read fresh at every scrape."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True)
class ResourceSample:
    rss_bytes: int  # resident memory of this process
    cpu_percent: float  # this process, since the previous sample; may exceed 100 on many cores
    system_memory_used_ratio: float  # 0..1, (total - available) / total
    cpu_count: int
    gpu_memory_bytes: int | None  # None when torch is not loaded or has no CUDA device


def _gpu_memory_bytes() -> int | None:
    # Only look at a torch someone else imported: importing it here would cost seconds and memory.
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        return sum(int(torch.cuda.memory_allocated(d)) for d in range(torch.cuda.device_count()))
    except Exception:  # a broken CUDA setup must not break a metrics scrape
        return None


class ResourceMonitor:
    """Samples this process and the host; register() exposes the samples as gauges."""

    def __init__(self, pid: int | None = None) -> None:
        self._process = psutil.Process(pid)
        self._lock = threading.Lock()
        # psutil's first cpu_percent() call only primes its counters; do it now so that the
        # first sample() measures since construction instead of returning 0.
        self._process.cpu_percent(interval=None)

    def sample(self) -> ResourceSample:
        with self._lock:  # cpu_percent keeps state between calls; scrapes may run in threads
            cpu = self._process.cpu_percent(interval=None)
            rss = self._process.memory_info().rss
        vm = psutil.virtual_memory()
        used = (vm.total - vm.available) / vm.total if vm.total else 0.0
        return ResourceSample(
            rss_bytes=int(rss),
            cpu_percent=float(cpu),
            system_memory_used_ratio=min(1.0, max(0.0, used)),
            cpu_count=os.cpu_count() or 1,
            gpu_memory_bytes=_gpu_memory_bytes(),
        )

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(_ResourceCollector(self))


_GAUGES: tuple[tuple[str, str], ...] = (
    ("surge:process_resident_memory_bytes", "Resident memory of the server process in bytes."),
    ("surge:process_cpu_percent", "CPU use of the server process since the previous scrape."),
    ("surge:system_memory_used_ratio", "Host memory in use, 0..1."),
    ("surge:gpu_memory_used_bytes", "GPU memory allocated by torch in bytes (absent: no GPU)."),
)


class _ResourceCollector(Collector):
    def __init__(self, monitor: ResourceMonitor) -> None:
        self._monitor = monitor

    def describe(self) -> Iterable[Metric]:
        # Names without sampling: lets the registry reject duplicates cheaply at register().
        return [GaugeMetricFamily(name, doc) for name, doc in _GAUGES]

    def collect(self) -> Iterable[Metric]:
        s = self._monitor.sample()
        values: tuple[float | None, ...] = (
            s.rss_bytes,
            s.cpu_percent,
            s.system_memory_used_ratio,
            s.gpu_memory_bytes,
        )
        families = []
        for (name, doc), value in zip(_GAUGES, values, strict=True):
            # No GPU: keep the family declared but with no sample, rather than a false 0.
            families.append(GaugeMetricFamily(name, doc, value=value))
        return families
