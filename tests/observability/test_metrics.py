"""ServerMetrics: exposed names, labels and values, parsed back from the text exposition."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from surge.engine.stats import EngineStats, PrefixCacheStats, SchedulerStats, StepStats
from surge.observability.metrics import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    ServerMetrics,
    build_1_2_5_buckets,
    time_per_output_token,
)

MODEL = "smollm2-135m"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(metrics: ServerMetrics) -> Samples:
    """Every sample of the rendered exposition, keyed by (name, labels)."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset({"model_name": MODEL, **labels}.items()))]


def stats(
    *,
    prefix_cache_queries: int = 0,
    prefix_cache_hits: int = 0,
    num_preemptions: int = 0,
    prompt_tokens: int = 0,
    generation_tokens: int = 0,
    **gauges: Any,
) -> EngineStats:
    """EngineStats with its counters set in the parts that own them."""
    return EngineStats(
        prefix_cache=PrefixCacheStats(queries=prefix_cache_queries, hits=prefix_cache_hits),
        scheduler=SchedulerStats(num_preemptions=num_preemptions),
        steps=StepStats(prompt_tokens=prompt_tokens, generation_tokens=generation_tokens),
        **gauges,
    )


def test_own_registry_each_time() -> None:
    a, b = ServerMetrics(MODEL), ServerMetrics(MODEL)
    assert a.registry is not b.registry
    reg = CollectorRegistry()
    assert ServerMetrics(MODEL, registry=reg).registry is reg


def test_series_exist_before_any_update() -> None:
    s = scrape(ServerMetrics(MODEL))
    assert value(s, "vllm:num_requests_running") == 0
    assert value(s, "vllm:prompt_tokens_total") == 0
    assert value(s, "vllm:request_success_total", finished_reason="stop") == 0
    assert value(s, "vllm:time_to_first_token_seconds_count") == 0


def test_update_engine_gauges_counters_and_info() -> None:
    m = ServerMetrics(MODEL)
    m.update_engine(
        stats(
            num_running=3, num_waiting=2, kv_cache_usage=0.25, num_blocks=100, block_size=16,
            prefix_cache_queries=40, prefix_cache_hits=10, num_preemptions=1,
            prompt_tokens=40, generation_tokens=7, iteration_tokens=[40, 3, 3],
        )
    )  # fmt: skip
    m.update_engine(
        stats(
            num_running=1, num_waiting=0, kv_cache_usage=0.5, num_blocks=100, block_size=16,
            prefix_cache_queries=60, prefix_cache_hits=25, num_preemptions=1,
            prompt_tokens=60, generation_tokens=12, iteration_tokens=[1],
        )
    )  # fmt: skip
    s = scrape(m)
    assert value(s, "vllm:num_requests_running") == 1
    assert value(s, "vllm:num_requests_waiting") == 0
    assert value(s, "vllm:kv_cache_usage_perc") == 0.5
    assert value(s, "vllm:prefix_cache_queries_total") == 60
    assert value(s, "vllm:prefix_cache_hits_total") == 25
    assert value(s, "vllm:num_preemptions_total") == 1
    assert value(s, "vllm:prompt_tokens_total") == 60
    assert value(s, "vllm:generation_tokens_total") == 12
    assert value(s, "vllm:iteration_tokens_total_count") == 4
    assert value(s, "vllm:iteration_tokens_total_sum") == 47
    assert value(s, "vllm:iteration_tokens_total_bucket", le="1.0") == 1
    assert value(s, "vllm:iteration_tokens_total_bucket", le="8.0") == 3
    assert value(s, "vllm:cache_config_info", num_gpu_blocks="100", block_size="16") == 1


def test_counters_survive_engine_restart() -> None:
    m = ServerMetrics(MODEL)
    m.update_engine(stats(prompt_tokens=100, generation_tokens=50))
    m.update_engine(stats(prompt_tokens=30, generation_tokens=5))  # restarted: all new
    m.update_engine(stats(prompt_tokens=35, generation_tokens=5))  # unchanged adds nothing
    s = scrape(m)
    assert value(s, "vllm:prompt_tokens_total") == 135
    assert value(s, "vllm:generation_tokens_total") == 55


def test_cache_config_info_keeps_only_current() -> None:
    m = ServerMetrics(MODEL)
    m.update_engine(stats(num_blocks=100, block_size=16))
    m.update_engine(stats(num_blocks=80, block_size=32))
    infos = {k: v for k, v in scrape(m).items() if k[0] == "vllm:cache_config_info"}
    labels = {"model_name": MODEL, "num_gpu_blocks": "80", "block_size": "32"}
    assert infos == {("vllm:cache_config_info", frozenset(labels.items())): 1.0}


def test_observe_request() -> None:
    m = ServerMetrics(MODEL, max_model_len=1000)
    m.observe_request(
        finish_reason="length", ttft_s=0.05, e2e_s=0.35, queue_s=0.01, itl_s=[0.1, 0.1, 0.1],
        num_prompt_tokens=12, num_generation_tokens=4, max_tokens=4, n=1,
    )  # fmt: skip
    m.observe_request(
        finish_reason="abort", ttft_s=None, e2e_s=2.0, queue_s=2.0, itl_s=[],
        num_prompt_tokens=3000, num_generation_tokens=0, max_tokens=None, n=2,
    )  # fmt: skip
    s = scrape(m)
    assert value(s, "vllm:request_success_total", finished_reason="length") == 1
    assert value(s, "vllm:request_success_total", finished_reason="abort") == 1
    assert value(s, "vllm:request_success_total", finished_reason="stop") == 0
    assert value(s, "vllm:time_to_first_token_seconds_count") == 1  # None is not observed
    assert value(s, "vllm:time_to_first_token_seconds_bucket", le="0.06") == 1
    assert value(s, "vllm:time_to_first_token_seconds_bucket", le="0.04") == 0
    assert value(s, "vllm:inter_token_latency_seconds_count") == 3
    assert value(s, "vllm:inter_token_latency_seconds_sum") == pytest.approx(0.3)
    assert value(s, "vllm:request_time_per_output_token_seconds_count") == 2
    assert value(s, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(0.1)
    assert value(s, "vllm:e2e_request_latency_seconds_count") == 2
    assert value(s, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(2.35)
    assert value(s, "vllm:request_queue_time_seconds_sum") == pytest.approx(2.01)
    assert value(s, "vllm:request_prompt_tokens_bucket", le="20.0") == 1
    assert value(s, "vllm:request_prompt_tokens_bucket", le="1000.0") == 1
    assert value(s, "vllm:request_prompt_tokens_bucket", le="+Inf") == 2
    assert value(s, "vllm:request_generation_tokens_sum") == 4
    assert value(s, "vllm:request_params_n_sum") == 3
    assert value(s, "vllm:request_params_max_tokens_count") == 1
    assert value(s, "vllm:request_params_max_tokens_bucket", le="5.0") == 1


def test_bucket_edges_like_vllm() -> None:
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(8192)[-1] == 5000
    assert TTFT_BUCKETS[0] == 0.001 and TTFT_BUCKETS[-1] == 2560
    assert ITL_BUCKETS[0] == 0.01 and ITL_BUCKETS[-1] == 80
    s = scrape(ServerMetrics(MODEL))
    assert value(s, "vllm:e2e_request_latency_seconds_bucket", le="7680.0") == 0
    assert value(s, "vllm:request_prompt_tokens_bucket", le="5000.0") == 0


def test_time_per_output_token() -> None:
    assert time_per_output_token(1.0, 0.1, 10) == pytest.approx(0.1)
    assert time_per_output_token(1.0, 0.1, 1) == 0.0
    assert time_per_output_token(1.0, 0.1, 0) == 0.0
    assert time_per_output_token(1.0, None, 5) == 0.0
    assert time_per_output_token(0.1, 0.2, 3) == 0.0  # clock disagreement clamps to 0


def test_rejections_aborts_health() -> None:
    m = ServerMetrics(MODEL)
    m.observe_rejection("queue_full")
    m.observe_rejection("queue_full")
    m.observe_rejection("rate_limit_tokens")
    m.observe_abort("client_disconnect")
    m.set_health(True)
    s = scrape(m)
    assert value(s, "vllm:admission_rejections_total", reason="queue_full") == 2
    assert value(s, "vllm:admission_rejections_total", reason="rate_limit_tokens") == 1
    assert value(s, "surge:request_aborts_total", reason="client_disconnect") == 1
    assert value(s, "vllm:engine_healthy") == 1
    m.set_health(False)
    assert value(scrape(m), "vllm:engine_healthy") == 0


def _request(m: ServerMetrics, tenant: str, tokens: int = 5) -> None:
    m.observe_request(
        finish_reason="stop", ttft_s=0.1, e2e_s=0.5, queue_s=0.2, itl_s=[],
        num_prompt_tokens=3, num_generation_tokens=tokens, max_tokens=16, n=1, tenant=tenant,
    )  # fmt: skip


def test_tenant_metrics() -> None:
    m = ServerMetrics(MODEL)
    _request(m, "acme", 5)
    _request(m, "acme", 7)
    _request(m, "", 100)  # no tenant: no tenant series
    s = scrape(m)
    assert value(s, "surge:tenant_generation_tokens_total", tenant="acme") == 12
    assert value(s, "surge:tenant_queue_time_seconds_count", tenant="acme") == 2
    tenants = {dict(k[1]).get("tenant") for k in s if k[0].startswith("surge:tenant_")}
    assert tenants == {"acme"}


def test_tenant_cardinality_cap() -> None:
    m = ServerMetrics(MODEL)
    for i in range(1005):
        _request(m, f"t{i}", 1)
    _request(m, "t0", 1)  # a known tenant keeps its own label after the cap is hit
    s = scrape(m)
    counts = {
        dict(k[1])["tenant"]: v
        for k, v in s.items()
        if k[0] == "surge:tenant_generation_tokens_total"
    }
    assert len(counts) == 1001
    assert counts["other"] == 5
    assert counts["t0"] == 2
    assert "t1000" not in counts


def test_per_tenant_and_priority_series() -> None:
    m = ServerMetrics(MODEL)
    m.observe_request(
        finish_reason="length", ttft_s=0.3, e2e_s=1.0, queue_s=0.25, itl_s=[],
        num_prompt_tokens=11, num_generation_tokens=4, max_tokens=4, n=1, tenant="acme",
        priority=-2,
    )  # fmt: skip
    m.update_engine(EngineStats(scheduler=SchedulerStats(tenant_tokens={"acme": 40, "": 9})))
    m.update_engine(EngineStats(scheduler=SchedulerStats(tenant_tokens={"acme": 55, "": 12})))
    s = scrape(m)
    assert value(s, "surge:tenant_scheduled_tokens_total", tenant="acme") == 55
    assert value(s, "surge:tenant_prompt_tokens_total", tenant="acme") == 11
    assert value(s, "surge:tenant_time_to_first_token_seconds_count", tenant="acme") == 1
    assert value(s, "surge:tenant_requests_total", tenant="acme", finished_reason="length") == 1
    assert value(s, "surge:priority_queue_time_seconds_sum", priority="-2") == 0.25
    assert value(s, "surge:priority_time_to_first_token_seconds_count", priority="-2") == 1
    # The anonymous tenant gets no series of its own.
    assert {dict(k[1]).get("tenant") for k in s if "tenant_scheduled" in k[0]} == {"acme"}
