"""The server's live view: once a second, read the engine's stats and the processes' CPU time,
judge the bottleneck (surge.observability.diagnosis), keep a short history for the dashboard,
and export `surge:bottleneck{kind}` and `surge:bottleneck_evidence{figure}` on /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psutil
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from surge.engine.client.client import AsyncEngineClient
from surge.engine.stats import EngineStats
from surge.observability.diagnosis import KINDS, Diagnoser, DiagnosisConfig, Sample
from surge.observability.metrics import ServerMetrics
from surge.observability.resources import GpuSample
from surge.observability.window import Buckets, History, Snapshot

log = logging.getLogger("surge.diagnosis")


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    interval_s: float = 1.0
    history_s: float = 120.0  # what the dashboard's charts show
    latency_window_s: float = 60.0  # TTFT/TPOT quantiles and the prefix hit rate
    rate_window_s: float = 10.0  # tokens/s, requests/s, tenant shares
    diagnosis: DiagnosisConfig = field(default_factory=DiagnosisConfig)


def _total(metric: Any, **match: str) -> float:
    """Sum of a counter's samples (all label sets, or those matching `match`)."""
    total = 0.0
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith("_total") and match.items() <= s.labels.items():
                total += s.value
    return total


def _by_label(metric: Any, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith("_total") and label in s.labels:
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def _buckets(histogram: Any) -> Buckets:
    pairs = []
    for family in histogram.collect():
        for s in family.samples:
            if s.name.endswith("_bucket"):
                pairs.append((float(s.labels["le"]), s.value))
    return tuple(sorted(pairs))


class _CpuTimes:
    """Cumulative CPU seconds (user + system, all threads) of named processes."""

    def __init__(self, pids: Mapping[str, int | None]) -> None:
        self._procs: dict[str, psutil.Process] = {}
        for name, pid in pids.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                self._procs[name] = psutil.Process(pid)

    def read(self, name: str) -> float | None:
        p = self._procs.get(name)
        if p is None:
            return None
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        return float(t.user + t.system)


def make_sample(
    now_s: float,
    stats: EngineStats,
    metrics: ServerMetrics,
    cpu: _CpuTimes,
    gpus: list[GpuSample],
) -> Sample:
    totals = [g.memory_total_bytes for g in gpus]
    utils = [g.utilization_percent for g in gpus if g.utilization_percent is not None]
    mem = [g.memory_used_bytes / t for g, t in zip(gpus, totals, strict=True) if t]
    return Sample(
        t_s=now_s,
        num_running=stats.num_running,
        num_waiting=stats.num_waiting,
        kv_usage=stats.kv_cache_usage,
        steps=stats.steps.num_steps,
        step_tokens=stats.steps.step_tokens,
        prefill_tokens=stats.steps.prefill_tokens,
        preemptions=stats.scheduler.num_preemptions,
        blocked_on_kv=stats.scheduler.num_blocked_on_kv,
        step_time_s=stats.steps.step_time_s,
        wait_time_s=stats.steps.wait_time_s,
        received=int(_total(metrics.received)),
        rejected=int(_total(metrics.rejections)),
        api_cpu_s=cpu.read("api"),
        engine_cpu_s=cpu.read("engine"),
        max_num_seqs=stats.max_num_seqs,
        max_num_batched_tokens=stats.max_num_batched_tokens,
        gpu_utilization_percent=sum(utils) / len(utils) if utils else None,
        gpu_memory_ratio=max(mem) if mem else None,
    )


class LiveMonitor:
    def __init__(
        self,
        client: AsyncEngineClient,
        metrics: ServerMetrics,
        pids: Mapping[str, int | None],
        gpus: Callable[[], list[GpuSample]] = list,
        config: MonitorConfig | None = None,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.config = config if config is not None else MonitorConfig()
        self.diagnoser = Diagnoser(self.config.diagnosis)
        self.history = History(max(self.config.history_s, self.config.latency_window_s))
        self._cpu = _CpuTimes(pids)
        self._gpus = gpus
        self.last_gpus: list[GpuSample] = []
        self.last_sample: Sample | None = None
        metrics.registry.register(_BottleneckCollector(self))

    def tick(self, now_s: float) -> None:
        """One reading: engine stats into the metrics, a sample into the diagnosis, a snapshot
        into the history."""
        m = self.metrics
        m.update_engine(self.client.take_stats())  # the same figures /metrics shows
        self.last_gpus = self._gpus()
        sample = make_sample(now_s, self.client.stats(), m, self._cpu, self.last_gpus)
        self.last_sample = sample
        before = self.diagnoser.current
        if self.diagnoser.update(sample, now_s):
            v = self.diagnoser.current
            figures = ", ".join(f"{k}={x:.3g}" for k, x in v.evidence.figures().items())
            log.info(
                "bottleneck %s -> %s: %s; suggested: %s [%s]",
                before.kind,
                v.kind,
                v.reason,
                v.action,
                figures,
            )
        engine = m.engine_counters
        counters = {
            "generation_tokens": _total(engine["steps.generation_tokens"]),
            "prompt_tokens": _total(engine["steps.prompt_tokens"]),
            "prefix_queries": _total(engine["prefix_cache.queries"]),
            "prefix_hits": _total(engine["prefix_cache.hits"]),
            "finished": _total(m.request_success),
            "received": float(sample.received),
            "rejected": float(sample.rejected),
        }
        for tenant, tokens in _by_label(m.tenant_scheduled_tokens, "tenant").items():
            counters["tenant:" + tenant] = tokens
        gauges = {
            "running": float(sample.num_running),
            "waiting": float(sample.num_waiting),
            "kv_usage": sample.kv_usage,
        }
        hist = {"ttft": _buckets(m.ttft), "tpot": _buckets(m.tpot)}
        snap = Snapshot(now_s, counters, hist, gauges)
        self.history.add(snap)
        gauges["tokens_per_s"] = self.history.rate("generation_tokens", self.config.rate_window_s)

    async def run(self) -> None:
        while True:
            try:
                self.tick(time.monotonic())
            except Exception:  # a bad reading must not end the live view
                log.exception("monitor tick failed")
            await asyncio.sleep(self.config.interval_s)

    # -- JSON for /v1/diagnosis and the dashboard ------------------------------------------

    def diagnosis_json(self, now_s: float) -> dict[str, Any]:
        v, since = self.diagnoser.current, self.diagnoser.since_s
        return {
            "kind": v.kind,
            "reason": v.reason,
            "action": v.action,
            "for_s": None if since is None else round(now_s - since, 1),
            "window_s": self.config.diagnosis.window_s,
            "evidence": v.evidence.figures(),
        }

    def state_json(self, now_s: float, model: str) -> dict[str, Any]:
        h, c = self.history, self.config
        snap = h.latest
        gauges = snap.gauges if snap is not None else {}
        counters = snap.counters if snap is not None else {}
        lw, rw = c.latency_window_s, c.rate_window_s
        queries, _ = h.delta("prefix_queries", lw)
        hits, _ = h.delta("prefix_hits", lw)
        tenants = {k[7:]: h.rate(k, rw) for k in counters if k.startswith("tenant:")}
        all_tenants = sum(tenants.values())
        e = self.diagnoser.current.evidence
        t0 = h.times()[0] if len(h) else now_s
        return {
            "kind": "server",
            "model": model,
            "time": time.time(),
            "running": int(gauges.get("running", 0)),
            "waiting": int(gauges.get("waiting", 0)),
            "kv_usage": gauges.get("kv_usage", 0.0),
            "tokens_per_s": h.rate("generation_tokens", rw),
            "prompt_tokens_per_s": h.rate("prompt_tokens", rw),
            "requests_per_s": h.rate("finished", rw),
            "generation_tokens_total": counters.get("generation_tokens", 0.0),
            "requests_finished_total": counters.get("finished", 0.0),
            "requests_rejected_total": counters.get("rejected", 0.0),
            "latency_window_s": lw,
            "ttft_p50_s": h.quantile("ttft", 0.5, lw),
            "ttft_p99_s": h.quantile("ttft", 0.99, lw),
            "tpot_p50_s": h.quantile("tpot", 0.5, lw),
            "tpot_p99_s": h.quantile("tpot", 0.99, lw),
            "prefix_hit_rate": hits / queries if queries > 0 else None,
            "bottleneck": self.diagnosis_json(now_s),
            "tenants": sorted(
                (
                    {
                        "tenant": t,
                        "tokens_per_s": r,
                        "share": r / all_tenants if all_tenants > 0 else 0.0,
                    }
                    for t, r in tenants.items()
                    if r > 0
                ),
                key=lambda x: -x["share"],
            ),
            "resources": {
                "api_cpu_percent": e.api_cpu_percent,
                "engine_cpu_percent": e.engine_cpu_percent,
                "engine_busy": e.engine_busy,
                "gpus": [
                    {
                        "index": g.index,
                        "utilization_percent": g.utilization_percent,
                        "memory_used_bytes": g.memory_used_bytes,
                        "memory_total_bytes": g.memory_total_bytes,
                    }
                    for g in self.last_gpus
                ],
            },
            "history": {
                "t": [round(t - t0, 2) for t in h.times()],
                "tokens_per_s": h.series("tokens_per_s"),
                "running": h.series("running"),
                "waiting": h.series("waiting"),
                "kv_usage": h.series("kv_usage"),
            },
        }


class _BottleneckCollector(Collector):
    def __init__(self, monitor: LiveMonitor) -> None:
        self._monitor = monitor

    def describe(self) -> Iterable[Metric]:
        return self._families()[:2]

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "surge:bottleneck",
                "What limits this replica now: 1 for the current kind, else 0 "
                "(docs/observability-diagnosis.md).",
                labels=["kind"],
            ),
            GaugeMetricFamily(
                "surge:bottleneck_evidence",
                "The figures of the diagnosis window, by name.",
                labels=["figure"],
            ),
        ]

    def collect(self) -> Iterable[Metric]:
        kind, evidence = self._families()
        current = self._monitor.diagnoser.current
        for k in KINDS:
            kind.add_metric([k], 1.0 if k == current.kind else 0.0)
        for name, value in current.evidence.figures().items():
            evidence.add_metric([name], value)
        return [kind, evidence]
