"""Signals from /metrics text, and rates from counters scraped at two times."""

from __future__ import annotations

import pytest

from surge.autoscale.signals import ReplicaLoad, SignalTracker, parse_metrics

TEXT = """\
# HELP vllm:num_requests_running Requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
vllm:num_requests_waiting{model_name="m"} 2.0
vllm:kv_cache_usage_perc{model_name="m"} 0.25
surge:requests_received_total{model_name="m"} 40.0
surge:requests_received_created{model_name="m"} 1.7e9
vllm:e2e_request_latency_seconds_sum{model_name="m"} 12.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 30.0
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 10.0
"""


def test_parse_reads_the_gauges_and_counters() -> None:
    load = parse_metrics("http://a", TEXT)
    assert (load.running, load.waiting, load.kv_usage) == (3.0, 2.0, 0.25)
    assert (load.received, load.latency_sum, load.latency_count) == (40.0, 12.0, 30.0)


def test_tracker_turns_counters_into_rates_per_replica() -> None:
    tracker = SignalTracker()
    first = tracker.update(0.0, [ReplicaLoad("a", True, received=10), ReplicaLoad("b", False)])
    assert first.arrival_rps is None and first.replicas == 1  # one scrape: no rate yet
    a = ReplicaLoad("a", True, running=4, received=30, latency_sum=8, latency_count=4)
    b = ReplicaLoad("b", True, running=2, waiting=1, received=500)  # new: no rate of its own yet
    s = tracker.update(10.0, [a, b])
    assert s.arrival_rps == pytest.approx(2.0) and s.mean_latency_s == pytest.approx(2.0)
    assert (s.replicas, s.running, s.waiting, s.ongoing) == (2, 6, 1, 7)
    restarted = ReplicaLoad("a", True, received=3)  # its counters began again
    later = tracker.update(20.0, [restarted, ReplicaLoad("b", True, received=520)])
    assert later.arrival_rps == pytest.approx(2.0)  # from b alone
    assert later.mean_latency_s == pytest.approx(2.0)  # kept until new requests finish


def test_scan_reads_names_with_and_without_a_namespace() -> None:
    """vLLM-style `vllm:x` series and plain Prometheus names (the gateway's
    surge_gateway_requests_awaiting_upstream, read by the autoscaler at zero replicas)."""
    from surge.observability.scan import scan_metrics

    text = (
        "# HELP surge_gateway_requests_awaiting_upstream x\n"
        "surge_gateway_requests_awaiting_upstream 3.0\n"
        "surge_gateway_requests_awaiting_upstream_other 9.0\n"
        'vllm:num_requests_waiting{model_name="m"} 2.0\n'
    )
    wanted = {"surge_gateway_requests_awaiting_upstream": "awaiting",
              "vllm:num_requests_waiting": "waiting"}  # fmt: skip
    assert scan_metrics(text, wanted) == {"awaiting": 3.0, "waiting": 2.0}
