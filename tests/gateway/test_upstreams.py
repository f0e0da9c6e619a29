"""Load scraped from /metrics text, the pool's reconciliation, and the upstreams-file watcher."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from surge.gateway.config import GatewayConfig, UpstreamConfig
from surge.gateway.upstreams import (
    FALLBACK,
    PRIMARY,
    ScrapedLoad,
    UpstreamPool,
    parse_load,
    watch_upstreams_file,
)

U1, U2, U3 = (f"http://127.0.0.1:800{i}" for i in (1, 2, 3))

SURGE_METRICS = """\
# HELP vllm:num_requests_running Requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="test-model"} 3.0
vllm:num_requests_waiting{model_name="test-model"} 7.0
vllm:num_requests_waiting{model_name="other-model"} 2.0
vllm:kv_cache_usage_perc{model_name="test-model"} 0.25
vllm:kv_cache_usage_perc{model_name="other-model"} 0.5
vllm:num_requests_waiting_by_reason{reason="capacity"} 99.0
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="test-model"} 5.0
"""


def test_parse_load_sums_queues_and_takes_the_fullest_cache() -> None:
    assert parse_load(SURGE_METRICS) == ScrapedLoad(9, 3, 0.5)


def test_parse_load_tolerates_missing_metrics_and_other_servers() -> None:
    assert parse_load("") == ScrapedLoad()
    assert parse_load("process_cpu_seconds_total 12.0\nvllm:num_requests_running 1") == (
        ScrapedLoad(num_running=1)
    )
    sglang = 'sglang:num_queue_reqs{model_name="x"} 4\nsglang:token_usage{model_name="x"} 0.9'
    assert parse_load(sglang) == ScrapedLoad(num_waiting=4, kv_cache_usage=0.9)
    assert parse_load('vllm:num_requests_waiting{a="b c"} oops') == ScrapedLoad()


def test_pool_reconcile_keeps_state_of_upstreams_that_stay() -> None:
    cfg = GatewayConfig(upstreams=(UpstreamConfig(U1),), upstreams_file="unused")
    pool = UpstreamPool(cfg)
    assert pool.set_dynamic([UpstreamConfig(U2)], [UpstreamConfig(U3)])
    u2 = pool.get(U2)
    assert u2 is not None
    u2.in_flight = 4
    assert not pool.set_dynamic([UpstreamConfig(U2)], [UpstreamConfig(U3)])  # no change
    assert pool.set_dynamic([UpstreamConfig(U2, weight=2)], [])
    assert pool.get(U2) is u2 and u2.in_flight == 4 and u2.config.weight == 2
    assert pool.get(U3) is None
    assert [u.url for u in pool.group(PRIMARY)] == [U1, U2] and not pool.group(FALLBACK)
    # The static upstream survives a file that omits it, and wins a clash.
    pool.set_dynamic([UpstreamConfig(U1, weight=9)])
    assert [u.url for u in pool.all()] == [U1]
    u1 = pool.get(U1)
    assert u1 is not None and u1.config.weight == 1


def test_candidates_leave_out_unhealthy_open_and_excluded() -> None:
    cfg = GatewayConfig(upstreams=tuple(UpstreamConfig(u) for u in (U1, U2, U3)))
    pool = UpstreamPool(cfg)
    u1, u2 = pool.get(U1), pool.get(U2)
    assert u1 is not None and u2 is not None
    for _ in range(cfg.health.outlier_failures):
        u1.health.on_traffic(False, 0.0)
    for _ in range(cfg.breaker.failure_threshold):
        permit = u2.breaker.allow(0.0)
        assert permit is not None
        u2.breaker.record(permit, False, 0.0)
    assert [u.url for u in pool.candidates(PRIMARY, 1.0)] == [U3]
    assert pool.candidates(PRIMARY, 1.0, exclude=[U3]) == []


async def test_file_watcher_reloads_on_change_and_on_signal(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.txt"
    path.write_text(f"{U1}\n")
    pool = UpstreamPool(GatewayConfig(upstreams_file=str(path)))
    reload_now = asyncio.Event()
    # A long interval: only the event (what SIGHUP sets) can trigger the first reload.
    task = asyncio.create_task(watch_upstreams_file(pool, str(path), 60.0, reload_now))
    try:
        await asyncio.sleep(0.05)
        assert pool.all() == []
        reload_now.set()
        await _until(lambda: [u.url for u in pool.all()] == [U1])
        path.write_text(f"{U1}\n{U2}\n")
        os.utime(path, ns=(1, 1))  # an mtime the watcher has not seen
        reload_now.set()
        await _until(lambda: [u.url for u in pool.all()] == [U1, U2])
        path.write_text("not a url\n")  # a bad file keeps the current set
        reload_now.set()
        await asyncio.sleep(0.1)
        assert [u.url for u in pool.all()] == [U1, U2]
    finally:
        task.cancel()


async def test_file_watcher_notices_mtime_change(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.txt"
    path.write_text(f"{U1}\n")
    pool = UpstreamPool(GatewayConfig(upstreams_file=str(path)))
    task = asyncio.create_task(watch_upstreams_file(pool, str(path), 0.02, asyncio.Event()))
    try:
        await asyncio.sleep(0.05)
        path.write_text(f"{U3}\n")
        os.utime(path, ns=(2, 2))
        await _until(lambda: [u.url for u in pool.all()] == [U3])
    finally:
        task.cancel()


async def _until(cond: Callable[[], bool], timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)
