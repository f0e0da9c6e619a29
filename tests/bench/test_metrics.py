"""`summarize` on hand-made records with answers worked out by hand."""

from __future__ import annotations

import pytest

from surge.bench.client import RequestRecord
from surge.bench.config import Slo
from surge.bench.metrics import Stats, meets_slo, summarize


def ok(
    index: int, send_s: float, chunk_s: list[float], tenant: str | None = None, **kw: object
) -> RequestRecord:
    return RequestRecord(
        index=index, max_tokens=len(chunk_s), tenant=tenant, send_s=send_s, chunk_s=chunk_s,
        done_s=chunk_s[-1], status=200, num_prompt_tokens=10, num_output_tokens=len(chunk_s),
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def records() -> list[RequestRecord]:
    return [
        # ttft 0.1, e2e 0.4, 4 tokens: tpot (0.4 - 0.1) / 3 = 0.1, itl 0.1 x3
        ok(0, 0.0, [0.1, 0.2, 0.3, 0.4], tenant="a", priority=0),
        # ttft 0.5, e2e 1.0, 2 tokens: tpot 0.5, itl 0.5
        ok(1, 1.0, [1.5, 2.0], tenant="b", priority=1),
        RequestRecord(
            2,
            8,
            tenant="a",
            send_s=2.0,
            done_s=2.01,
            status=429,
            error_type="http_429",
            error="queue full",
        ),
        RequestRecord(3, 8, tenant="b", send_s=2.0, done_s=2.0, error_type="ConnectError"),
        # cut off by the run's end after 3 s without a first token: broke a 0.2 s TTFT target
        RequestRecord(4, 8, tenant="b", send_s=2.0, done_s=5.0, cancelled=True),
        # cut off after 0.1 s: whether it would have met the SLO is unknown
        RequestRecord(5, 8, send_s=4.9, done_s=5.0, cancelled=True),
    ]


def test_counts_errors_by_type_and_throughput() -> None:
    r = summarize(records(), duration_s=10.0)
    assert (r.num_requests, r.num_ok, r.num_errors, r.num_cancelled) == (6, 2, 2, 2)
    assert r.errors == {"ConnectError": 1, "http_429": 1}
    assert r.request_rps == pytest.approx(0.2)
    assert r.num_output_tokens == 6 and r.output_tok_s == pytest.approx(0.6)
    assert r.total_tok_s == pytest.approx((6 + 20) / 10)
    assert r.goodput is None  # no SLO


def test_latency_statistics() -> None:
    r = summarize(records(), duration_s=10.0)
    # two TTFTs, 0.1 and 0.5: linear interpolation between them
    assert r.ttft.count == 2
    assert r.ttft.mean == pytest.approx(0.3)
    assert r.ttft.p50 == pytest.approx(0.3)
    assert r.ttft.p90 == pytest.approx(0.1 + 0.9 * 0.4)
    assert r.ttft.max == pytest.approx(0.5)
    assert (r.tpot.mean, r.tpot.max) == (pytest.approx(0.3), pytest.approx(0.5))
    assert (r.e2e.p50, r.e2e.max) == (pytest.approx(0.7), pytest.approx(1.0))
    # ITL pools every gap: 0.1, 0.1, 0.1, 0.5
    assert r.itl.count == 4
    assert r.itl.p50 == pytest.approx(0.1) and r.itl.mean == pytest.approx(0.2)
    assert r.itl.p99 == pytest.approx(0.1 + 0.97 * 0.4)


def test_goodput_under_an_slo() -> None:
    r = summarize(records(), Slo(ttft_s=0.2), duration_s=10.0)
    g = r.goodput
    assert g is not None
    # met: record 0; missed: 1 (ttft), 2 and 3 (errors), 4 (cut off past the target); 5 unknown
    assert (g.num_met, g.num_judged) == (1, 5)
    assert g.fraction_met == pytest.approx(0.2)
    assert g.rps == pytest.approx(0.1) and g.output_tok_s == pytest.approx(0.4)
    tpot = summarize(records(), Slo(tpot_s=0.2, e2e_s=5.0), duration_s=10.0).goodput
    assert tpot is not None and tpot.num_met == 1  # record 1's tpot is 0.5


def test_slo_verdicts_per_record() -> None:
    rs = records()
    slo = Slo(ttft_s=0.2, tpot_s=0.2, e2e_s=1.0)
    assert [meets_slo(r, slo) for r in rs] == [True, False, False, False, False, None]
    one_token = ok(9, 0.0, [0.1])  # no TPOT with one token: the target is not broken
    assert meets_slo(one_token, Slo(tpot_s=0.001)) is True


def test_split_by_tenant_and_priority_share_the_duration() -> None:
    r = summarize(records(), Slo(ttft_s=0.2), duration_s=10.0)
    assert set(r.by_tenant) == {"a", "b"}
    a, b = r.by_tenant["a"], r.by_tenant["b"]
    assert (a.num_requests, a.num_ok, a.errors) == (2, 1, {"http_429": 1})
    assert (b.num_requests, b.num_ok, b.num_cancelled) == (3, 1, 1)
    assert a.request_rps + b.request_rps == pytest.approx(r.request_rps)
    assert a.ttft.p50 == pytest.approx(0.1) and b.ttft.p50 == pytest.approx(0.5)
    assert a.goodput is not None and a.goodput.fraction_met == pytest.approx(0.5)
    assert set(r.by_priority) == {"0", "1"}
    assert r.by_priority["1"].tpot.p50 == pytest.approx(0.5)
    assert not a.by_tenant  # splits are one level deep


def test_duration_defaults_to_first_send_to_last_answer() -> None:
    assert summarize(records()).duration_s == pytest.approx(5.0)


def test_empty_sample_has_no_statistics() -> None:
    assert Stats.of([]) == Stats(0, None, None, None, None, None, None)
    r = summarize([], Slo(ttft_s=1.0))
    assert r.num_requests == 0 and r.request_rps == 0.0 and r.ttft.p50 is None
    assert r.goodput is not None and r.goodput.fraction_met is None


def test_output_tokens_fall_back_to_chunks_without_usage() -> None:
    rec = ok(0, 0.0, [0.1, 0.2, 0.3])
    rec.num_output_tokens = None
    assert rec.output_tokens == 3 and rec.tpot_s == pytest.approx(0.1)
    rec.scheduled_s = -0.05
    assert rec.lateness_s == pytest.approx(0.05)
