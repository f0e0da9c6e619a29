"""The bottleneck rules as pure objects over plain samples, and the windowed figures."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from surge.observability.diagnosis import (
    ACTIONS,
    KINDS,
    Diagnoser,
    DiagnosisConfig,
    Sample,
    diagnose,
    evidence,
)
from surge.observability.window import History, Snapshot, bucket_delta, histogram_quantile

CONFIG = DiagnosisConfig()
LIMITS = {"max_num_seqs": 4, "max_num_batched_tokens": 64}


def window(**per_second: float) -> list[Sample]:
    """11 samples 1 s apart; gauges as given, counters growing by the given amount a second
    (keys ending in _rate), the rest held."""
    rates = {k[:-5]: v for k, v in per_second.items() if k.endswith("_rate")}
    gauges = {k: v for k, v in per_second.items() if not k.endswith("_rate")}
    out = []
    for i in range(11):
        fields = {k: (int(v * i) if k not in _FLOATS else v * i) for k, v in rates.items()}
        out.append(Sample(t_s=100.0 + i, **LIMITS, **gauges, **fields))  # type: ignore[arg-type]
    return out


_FLOATS = {"step_time_s", "wait_time_s", "api_cpu_s", "engine_cpu_s"}


def busy_decode(**extra: float) -> list[Sample]:
    """Four running (the cap), two waiting, decode-only steps, the engine always in step."""
    base: dict[str, float] = dict(num_running=4, num_waiting=2, steps_rate=10,
                                  step_tokens_rate=40, step_time_s_rate=1.0)  # fmt: skip
    base.update(extra)
    return window(**base)


def test_each_kind_has_an_action() -> None:
    assert set(ACTIONS) == set(KINDS)


def test_idle_when_nothing_ran() -> None:
    v = diagnose(window(wait_time_s_rate=1.0), CONFIG)
    assert v.kind == "idle" and v.evidence.steps == 0


def test_compute_when_slots_full_busy_and_queueing() -> None:
    v = diagnose(busy_decode(), CONFIG)
    assert v.kind == "compute"
    assert v.evidence.seq_fill == 1.0 and v.evidence.engine_busy == 1.0
    # No queue: the same full, busy engine is healthy (it keeps up).
    assert diagnose(busy_decode(num_waiting=0), CONFIG).kind == "healthy"
    # Idle half the time: not compute-bound.
    assert diagnose(busy_decode(wait_time_s_rate=1.0), CONFIG).kind == "healthy"


def test_compute_from_a_busy_gpu_when_step_time_is_not_known() -> None:
    samples = [replace(s, step_time_s=0.0, gpu_utilization_percent=97.0, gpu_memory_ratio=0.9)
               for s in busy_decode()]  # fmt: skip
    v = diagnose(samples, CONFIG)
    assert v.kind == "compute" and v.evidence.gpu_utilization_percent == 97.0
    cool = [replace(s, gpu_utilization_percent=20.0) for s in samples]
    assert diagnose(cool, CONFIG).kind == "healthy"


def test_prefill_when_full_steps_are_prefill_chunks() -> None:
    samples = window(num_running=1, num_waiting=3, steps_rate=5, step_tokens_rate=320,
                     prefill_tokens_rate=300, step_time_s_rate=1.0)  # fmt: skip
    v = diagnose(samples, CONFIG)
    assert v.kind == "prefill" and v.evidence.budget_fill == 1.0
    assert v.evidence.prefill_share == pytest.approx(300 / 320)
    assert "token budget" in v.action


def test_kv_memory_from_blocked_admissions_preemptions_or_a_full_pool() -> None:
    assert diagnose(busy_decode(blocked_on_kv_rate=5), CONFIG).kind == "kv_memory"
    assert diagnose(busy_decode(preemptions_rate=0.2), CONFIG).kind == "kv_memory"
    full = window(num_running=1, num_waiting=3, kv_usage=0.97, steps_rate=10,
                  step_tokens_rate=10, step_time_s_rate=1.0)  # fmt: skip
    assert diagnose(full, CONFIG).kind == "kv_memory"
    # A rare blocked admission (under 10% of steps) is not the bottleneck.
    assert diagnose(busy_decode(blocked_on_kv_rate=0.2), CONFIG).kind == "compute"


def test_admission_first_when_users_get_429s() -> None:
    v = diagnose(busy_decode(received_rate=10, rejected_rate=2, blocked_on_kv_rate=5), CONFIG)
    assert v.kind == "admission" and v.evidence.rejected_share == pytest.approx(0.2)
    # One refusal in a thousand is under the 2% threshold.
    assert diagnose(busy_decode(received_rate=100, rejected_rate=0.1), CONFIG).kind == "compute"


def test_api_process_when_http_cpu_saturated_and_engine_waits() -> None:
    samples = window(num_running=1, steps_rate=10, step_tokens_rate=10, step_time_s_rate=0.2,
                     wait_time_s_rate=0.8, received_rate=50, api_cpu_s_rate=0.97,
                     engine_cpu_s_rate=0.3)  # fmt: skip
    v = diagnose(samples, CONFIG)
    assert v.kind == "api_process"
    assert v.evidence.api_cpu_percent == pytest.approx(97.0)
    assert v.evidence.engine_cpu_percent == pytest.approx(30.0)
    # The engine busy too: the HTTP process is not what limits.
    hot = [replace(s, step_time_s=s.step_time_s * 4, wait_time_s=0.0) for s in samples]
    assert diagnose(hot, CONFIG).kind != "api_process"


def test_short_window_only_idle_or_healthy() -> None:
    samples = busy_decode(received_rate=10, rejected_rate=5)[:2]  # 1 s < min_span_s
    assert diagnose(samples, CONFIG).kind == "healthy"
    assert diagnose(window(wait_time_s_rate=1.0)[:1], CONFIG).kind == "idle"


def test_thresholds_come_from_the_config() -> None:
    samples = busy_decode(received_rate=10, rejected_rate=2)
    assert diagnose(samples, replace(CONFIG, rejected_share=0.5)).kind == "compute"
    with pytest.raises(ValueError):
        DiagnosisConfig(window_s=1.0, min_span_s=2.0)


def test_diagnoser_slides_its_window_and_reports_changes() -> None:
    d = Diagnoser(DiagnosisConfig(window_s=5.0))
    changes = []
    busy = busy_decode()
    for s in busy:
        changes.append(d.update(s, now_s=s.t_s))
    assert d.current.kind == "compute" and changes.count(True) == 2  # healthy, then compute
    last = busy[-1]
    # Then nothing moves for a while: the window slides past the work, idle.
    for i in range(1, 8):
        t = last.t_s + i
        d.update(replace(last, t_s=t, num_running=0, num_waiting=0, wait_time_s=float(i)), t)
    assert d.current.kind == "idle" and d.since_s is not None and d.since_s > last.t_s
    assert evidence([]).steps == 0


def test_histogram_quantile_as_prometheus() -> None:
    buckets = ((0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (math.inf, 20.0))
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.5)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.3)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.99)
    assert histogram_quantile(0.5, ((0.1, 0.0), (math.inf, 0.0))) is None
    # Everything above the last finite bound: that bound.
    assert histogram_quantile(0.5, ((1.0, 0.0), (math.inf, 4.0))) == 1.0
    assert bucket_delta(((1.0, 5.0),), ((1.0, 2.0),)) == ((1.0, 3.0),)
    assert bucket_delta(((1.0, 1.0),), ((1.0, 2.0),)) == ((1.0, 1.0),)  # restarted


def test_history_rates_and_window_quantiles() -> None:
    h = History(keep_s=60.0)
    inf = math.inf
    for i in range(121):
        # 10 tokens/s; one request a second, all in the (0.1, 0.5] bucket after t=60.
        old = min(i, 60)
        new = max(0, i - 60)
        hist = ((0.1, float(old)), (0.5, float(old + new)), (inf, float(old + new)))
        h.add(Snapshot(float(i), {"tokens": 10.0 * i}, {"ttft": hist}, {"running": 1.0}))
    assert len(h) == 61  # 60 s kept
    assert h.rate("tokens", 10.0) == pytest.approx(10.0)
    assert h.quantile("ttft", 0.5, 30.0) == pytest.approx(0.3)  # only the newer requests
    assert h.series("running") == [1.0] * 61
