"""Process, host and GPU resource gauges, read fresh at every scrape.

The server is two processes, and the engine is the one that holds the model, the KV cache and
the cores: each is reported under its `process` label. GPUs are read through NVML (the driver's
library, `pip install 'surge[gpu]'` for its Python binding) when present: memory used and total
and utilization per device, whoever allocated it; without NVML, torch's own allocation count
for this process, when torch is loaded and has a CUDA device.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProcessSample:
    name: str
    rss_bytes: int  # resident memory
    cpu_percent: float  # since the previous sample; may exceed 100 on many cores


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    memory_used_bytes: int
    memory_total_bytes: int | None  # None: only torch's count of this process is known
    utilization_percent: float | None


@dataclass(frozen=True, slots=True)
class ResourceSample:
    processes: list[ProcessSample]  # the ones still alive
    system_memory_used_ratio: float  # 0..1, (total - available) / total
    system_cpu_percent: float  # all cores, since the previous sample, 0..100
    cpu_count: int
    gpus: list[GpuSample]  # empty: no GPU seen

    def process(self, name: str) -> ProcessSample | None:
        return next((p for p in self.processes if p.name == name), None)


class _Nvml:
    """NVML through pynvml, initialised once; None from `open()` when absent or failing."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    @classmethod
    def open(cls) -> _Nvml | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            return cls(pynvml)
        except Exception:  # no binding, no driver, no device: no NVML gauges
            return None

    def sample(self) -> list[GpuSample]:
        out = []
        for i, handle in enumerate(self._handles):
            try:
                mem = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                out.append(GpuSample(i, int(mem.used), int(mem.total), float(util.gpu)))
            except Exception:  # a device that fails to answer is left out of this scrape
                log.debug("NVML: device %d did not answer", i, exc_info=True)
        return out


def _torch_gpus() -> list[GpuSample]:
    # Only a torch someone else imported: importing it here would cost seconds and memory.
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available():
            return []
        return [
            GpuSample(d, int(torch.cuda.memory_allocated(d)), None, None)
            for d in range(torch.cuda.device_count())
        ]
    except Exception:  # a broken CUDA setup must not break a metrics scrape
        return []


class ResourceMonitor:
    """Samples the named processes (default: this one, as "api"), the host and its GPUs;
    register() exposes the samples as gauges."""

    def __init__(self, processes: Mapping[str, int | None] | None = None) -> None:
        named = processes if processes is not None else {"api": None}
        self._processes: dict[str, psutil.Process] = {}
        for name, pid in named.items():
            try:
                self._processes[name] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                log.warning("resource monitor: no process %s (%s)", pid, name)
        self._lock = threading.Lock()
        self._nvml = _Nvml.open()
        # psutil's first cpu_percent() calls only prime its counters; do it now so that the
        # first sample() measures since construction instead of returning 0.
        for p in self._processes.values():
            p.cpu_percent(interval=None)
        psutil.cpu_percent(interval=None)

    def sample(self) -> ResourceSample:
        with self._lock:  # cpu_percent keeps state between calls; scrapes may run in threads
            processes = []
            for name, p in list(self._processes.items()):
                try:
                    with p.oneshot():
                        cpu, rss = p.cpu_percent(interval=None), p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    continue  # exited: reported no more (its last values would be a lie)
                processes.append(ProcessSample(name, int(rss), float(cpu)))
            system_cpu = psutil.cpu_percent(interval=None)
        vm = psutil.virtual_memory()
        used = (vm.total - vm.available) / vm.total if vm.total else 0.0
        return ResourceSample(
            processes=processes,
            system_memory_used_ratio=min(1.0, max(0.0, used)),
            system_cpu_percent=float(system_cpu),
            cpu_count=os.cpu_count() or 1,
            gpus=self._nvml.sample() if self._nvml is not None else _torch_gpus(),
        )

    def gpus(self) -> list[GpuSample]:
        """The GPUs alone (NVML keeps no state between reads: any caller may ask)."""
        return self._nvml.sample() if self._nvml is not None else _torch_gpus()

    def register(self, registry: CollectorRegistry) -> None:
        registry.register(_ResourceCollector(self))


class _ResourceCollector(Collector):
    def __init__(self, monitor: ResourceMonitor) -> None:
        self._monitor = monitor

    def describe(self) -> Iterable[Metric]:
        # Names without sampling: lets the registry reject duplicates cheaply at register().
        return _families()

    def collect(self) -> Iterable[Metric]:
        s = self._monitor.sample()
        families = _families()
        rss, cpu, mem, host_cpu, gpu_used, gpu_total, util = families
        for p in s.processes:
            rss.add_metric([p.name], p.rss_bytes)
            cpu.add_metric([p.name], p.cpu_percent)
        mem.add_metric([], s.system_memory_used_ratio)
        host_cpu.add_metric([], s.system_cpu_percent)
        # No GPU: the families stay declared with no sample, rather than a false 0.
        for g in s.gpus:
            gpu_used.add_metric([str(g.index)], g.memory_used_bytes)
            if g.memory_total_bytes is not None:
                gpu_total.add_metric([str(g.index)], g.memory_total_bytes)
            if g.utilization_percent is not None:
                util.add_metric([str(g.index)], g.utilization_percent)
        return families


def _families() -> list[GaugeMetricFamily]:
    def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=labels)

    proc, gpu = ["process"], ["gpu"]
    return [
        gauge(
            "surge:process_resident_memory_bytes",
            "Resident memory by process (api, engine) in bytes.",
            proc,
        ),
        gauge(
            "surge:process_cpu_percent",
            "CPU use by process since the previous scrape (100 = one core).",
            proc,
        ),
        gauge("surge:system_memory_used_ratio", "Host memory in use, 0..1.", []),
        gauge(
            "surge:system_cpu_percent",
            "Host CPU use over all cores since the previous scrape, 0..100.",
            [],
        ),
        gauge(
            "surge:gpu_memory_used_bytes",
            "GPU memory in use (NVML: by anyone; else torch's allocation here).",
            gpu,
        ),
        gauge("surge:gpu_memory_total_bytes", "GPU memory in all (NVML).", gpu),
        gauge(
            "surge:gpu_utilization_percent",
            "Time a kernel ran over the last sample period, 0..100 (NVML).",
            gpu,
        ),
    ]
