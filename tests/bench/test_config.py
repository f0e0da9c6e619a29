"""The CLI's mini-syntax and the configs' validation."""

from __future__ import annotations

import pytest

from surge.bench.config import (
    ArrivalConfig,
    BenchConfig,
    LengthDist,
    Slo,
    Tenant,
    WorkloadConfig,
    parse_duration,
    parse_tenants,
)


def test_length_specs() -> None:
    assert LengthDist.parse("128") == LengthDist("fixed", 128)
    assert LengthDist.parse("uniform:64,256") == LengthDist("uniform", 64, 256)
    assert LengthDist.parse("normal:128,32") == LengthDist("normal", 128, 32)
    assert LengthDist.parse("lognormal:100,0.5") == LengthDist("lognormal", 100, 0.5)
    for bad in ("uniform:256,64", "zipf:3", "normal:1", "0"):
        with pytest.raises(ValueError):
            LengthDist.parse(bad)


def test_slo_spec() -> None:
    assert Slo.parse("ttft=2s,tpot=100ms,e2e=30") == Slo(2.0, 0.1, 30.0)
    assert Slo.parse("tpot=50ms") == Slo(tpot_s=0.05)
    assert not Slo().is_set
    with pytest.raises(ValueError, match="unknown target"):
        Slo.parse("itl=1s")
    with pytest.raises(ValueError, match="ttft_s"):
        Slo(ttft_s=0)
    assert parse_duration("5m") == 300 and parse_duration("250ms") == 0.25


def test_tenant_spec() -> None:
    assert parse_tenants("a:3,b:1") == (Tenant("a", 3.0), Tenant("b", 1.0))
    assert parse_tenants("a:10:0,b:1:5") == (Tenant("a", 10.0, 0), Tenant("b", 1.0, 5))
    with pytest.raises(ValueError, match="weight"):
        parse_tenants("a:0")
    with pytest.raises(ValueError, match="unique"):
        WorkloadConfig(tenants=parse_tenants("a,a"))


def test_traffic_specs() -> None:
    s = ArrivalConfig.parse("sinusoid:base=2,peak=20,period=3600")
    assert (s.kind, s.base_rps, s.peak_rps, s.period_s, s.peak) == ("sinusoid", 2, 20, 3600, 20)
    p = ArrivalConfig.parse("pulse:size=10,period=5,base=1")
    assert (p.burst_size, p.period_s, p.base_rps, p.peak) == (10, 5, 1, 3.0)
    st = ArrivalConfig.parse("step:0:2,30:8,60:4")
    assert st.steps == ((0, 2), (30, 8), (60, 4)) and st.peak == 8
    assert ArrivalConfig.parse("gamma:rate=4,cv=2") == ArrivalConfig("gamma", rate_rps=4, cv=2)
    for bad in ("step:5:2", "step:0:2,0:3", "poisson:rate=0", "poisson:speed=3", "wave:rate=1"):
        with pytest.raises(ValueError):
            ArrivalConfig.parse(bad)


def test_bench_config_must_end_and_pick_one_loop() -> None:
    url = "http://127.0.0.1:1"
    BenchConfig(url, "m", num_requests=5)
    with pytest.raises(ValueError, match="must end"):
        BenchConfig(url, "m")
    with pytest.raises(ValueError, match="exactly one"):
        BenchConfig(url, "m", arrival=ArrivalConfig("poisson"), num_requests=5)
    with pytest.raises(ValueError, match="exactly one"):
        BenchConfig(url, "m", concurrency=None, num_requests=5)
    with pytest.raises(ValueError, match="url"):
        BenchConfig("127.0.0.1:8000", "m", num_requests=5)
    with pytest.raises(ValueError, match="trace"):
        BenchConfig(url, "m", concurrency=None, arrival=ArrivalConfig("trace"), num_requests=5)
    with pytest.raises(ValueError, match="prefix"):
        WorkloadConfig(num_prefix_groups=4)
