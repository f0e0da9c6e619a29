"""Batch work in the autoscaler's decision, on plain data: the batch series read from /metrics
(the contract with the Batch API: surge:batch_lines{state}, surge:batch_tokens_total,
surge:batch_window_seconds_left, surge:batch_lines_per_second), lines in the engines kept out of
the interactive load, replicas added only for a batch that would miss its window, and HPA's
rate policies per scale period in the Stabilizer."""

from __future__ import annotations

import pytest

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.decide import BatchJudge, Stabilizer, batch_replicas, desired_replicas
from surge.autoscale.signals import (
    BatchLoad,
    BatchSignals,
    ReplicaLoad,
    Signals,
    SignalTracker,
    parse_batch,
    parse_metrics,
)

CFG = AutoscalerConfig(
    min_replicas=1,
    max_replicas=50,
    target_ongoing_per_replica=10,
    target_waiting_per_replica=2,
    tolerance=0.1,
    batch_margin_s=120.0,
    batch_window_s=30.0,
)

TEXT = """\
# TYPE surge:batch_lines gauge
surge:batch_lines{state="pending"} 900.0
surge:batch_lines{state="in_flight"} 6.0
surge:batch_lines{state="completed"} 94.0
surge:batch_lines{state="failed"} 1.0
surge:batch_tokens_total 12000.0
surge:batch_tokens_created 1.7e9
surge:batch_window_seconds_left{batch="batch_a"} 7200.0
surge:batch_window_seconds_left{batch="batch_b"} 0.0
surge:batch_window_seconds_left{batch="batch_c"} 3600.0
surge:batch_lines_per_second 2.5
vllm:num_requests_running{model_name="m"} 9.0
vllm:num_requests_waiting{model_name="m"} 1.0
"""


def test_the_batch_series_are_read_by_state_and_the_nearest_deadline() -> None:
    b = parse_batch(TEXT)
    assert (b.pending, b.in_flight, b.completed, b.failed) == (900, 6, 94, 1)
    assert (b.tokens, b.lines_per_s) == (12000, 2.5)
    assert b.window_left_s == 3600  # the smallest positive window: 0 is a batch with none
    load = parse_metrics("http://a", TEXT)
    assert (load.running, load.waiting, load.batch) == (9, 1, b)
    assert parse_batch("vllm:num_requests_running 3\n") == BatchLoad()  # no batch: all zero


def test_the_tracker_adds_replicas_and_gateway_batches() -> None:
    tracker = SignalTracker()
    gw = ReplicaLoad(
        "gw",
        True,
        waiting=50,
        batch=BatchLoad(pending=400, in_flight=8, tokens=100, window_left_s=900, lines_per_s=1.0),
    )
    a = ReplicaLoad(
        "a",
        True,
        running=9,
        waiting=3,
        received=100,
        batch=BatchLoad(pending=100, in_flight=4, tokens=50, window_left_s=1800, lines_per_s=0.5),
    )
    first = tracker.update(0.0, [a], gw)
    assert first.batch.remaining == 512 and first.batch.window_left_s == 900
    assert first.batch.lines_per_s == 1.5 and first.batch.tokens_per_s is None
    # The gateway's own series (its 50 waiting) are not a replica's load.
    assert (first.replicas, first.waiting, first.running) == (1, 3, 9)
    # Of a's 3 waiting, its 4 lines in flight may be all of them (an engine preempts its lines
    # for interactive requests): none is counted as an interactive request waiting.
    assert first.batch.waiting == 3 and first.interactive_waiting == 0
    assert first.ongoing == 0  # 12 sequences, all 12 of them lines (4 of a's, 8 of the gateway's)
    gw2 = ReplicaLoad("gw", True, batch=BatchLoad(tokens=300, window_left_s=890, lines_per_s=1))
    b = BatchLoad(tokens=150, window_left_s=1790, lines_per_s=0.5)
    a2 = ReplicaLoad("a", True, running=9, received=150, batch=b)
    later = tracker.update(10.0, [a2], gw2)
    assert later.batch.tokens_per_s == pytest.approx(30.0)  # (200 + 100) tokens in 10 s
    assert later.ongoing == 9
    # 5 requests a second reached a's admission, 1.5 of them batch lines (they are counted
    # there too): the forecast is fed the 3.5 interactive ones.
    assert later.arrival_rps == pytest.approx(3.5)


def signals(
    ready: int, running: float, waiting: float = 0.0, batch: BatchSignals | None = None
) -> Signals:
    return Signals(ready, waiting, running, 0.0, None, None, batch or BatchSignals())


def test_lines_in_the_engines_are_not_load_to_scale_for() -> None:
    # 4 replicas each running 10 sequences, 30 of them batch lines, on pace for their window.
    on_pace = BatchSignals(pending=100, in_flight=30, window_left_s=3600, lines_per_s=3.0)
    d = desired_replicas(signals(4, 40, batch=on_pace), CFG, None, current=4)
    assert d.wants["ongoing"] == 1 and d.wants["batch"] <= 4 and d.desired <= 4
    # The same 40 sequences all interactive ask for 4 (no batch to leave out).
    assert desired_replicas(signals(4, 40), CFG, None, current=4).desired == 4


def test_a_backlog_on_pace_asks_for_no_replica_a_late_one_for_what_finishes_it() -> None:
    # 10 interactive requests and 20 lines in flight on 3 replicas (target 10 each); a line
    # takes 20 lines / 2 per s = 10 s.
    def batch(pending: float, window_s: float) -> BatchSignals:
        return BatchSignals(pending=pending, in_flight=20, window_left_s=window_s, lines_per_s=2)

    # 1,000 lines in 2 h: 1,020 / (7,200 - 120) = 0.14 lines/s x 10 s = 1.4 in flight: the
    # leftover holds them; the fleet the interactive load and this pace need is 2.
    n, why = batch_replicas(batch(1000, 7200), 10, 3, CFG)
    assert n == 2, why
    # 10,000 lines in 10 minutes: 10,020 / (600 - 120) = 20.9/s x 10 s = 209 in flight + 10
    # interactive = 219 sequences: 22 replicas, the batch's want (the others ask for 1).
    d = desired_replicas(signals(3, 30, batch=batch(10_000, 600)), CFG, None, current=3)
    assert d.wants["batch"] == 22 and d.desired == 22 and d.reason.startswith("batch")
    # Past its window (0 left: no active batch) it asks for none.
    assert batch_replicas(batch(10_000, 0), 10, 3, CFG)[0] == 0


def test_without_a_pace_a_running_batch_waits_and_a_starved_one_asks_for_room() -> None:
    started = BatchSignals(pending=500, in_flight=20, window_left_s=600, lines_per_s=0)
    assert batch_replicas(started, 10, 2, CFG)[0] == 0  # lines run, none done yet: no judgement
    # Lines wait, none runs: 20 interactive fill the 2 replicas' target; one line more asks for 3.
    starved = BatchSignals(pending=500, in_flight=0, window_left_s=600, lines_per_s=0)
    assert batch_replicas(starved, 20, 2, CFG)[0] == 3
    # With a line's time known from before (10 s), the want is sized, not a guess.
    assert batch_replicas(starved, 20, 2, CFG, line_s=10.0)[0] == 4  # 20 + 500/480 x 10 = 30.4


def test_the_judge_counts_a_call_for_more_only_once_it_has_lasted_its_window() -> None:
    judge = BatchJudge(CFG)
    late = BatchSignals(pending=10_000, in_flight=20, window_left_s=600, lines_per_s=2)
    s = signals(3, 30, batch=late)
    assert judge.want(0.0, s)[0] == 0  # just begun: its pace is measured on few lines
    assert judge.want(20.0, s)[0] == 0
    assert judge.want(31.0, s)[0] == 22  # 22 for a whole window
    # A blip lower within the window holds it lower (HPA's up window for this signal).
    fast = BatchSignals(pending=10_000, in_flight=20, window_left_s=600, lines_per_s=20)
    assert judge.want(32.0, signals(3, 30, batch=fast))[0] == 3
    assert judge.want(40.0, s)[0] == 3
    # No batch: nothing asked, and the next batch is judged afresh.
    assert judge.want(50.0, signals(3, 10))[0] == 0
    assert judge.want(51.0, s)[0] == 0


def test_hpa_rate_policies_bound_each_period_not_each_decision() -> None:
    # HPA's defaults: up by max(4 pods, 100%) per 15 s; down by 100% per 15 s after 300 s.
    hpa = AutoscalerConfig(
        max_replicas=100,
        scale_down_window_s=300,
        scale_period_s=15,
        max_scale_up_step=4,
        max_scale_up_percent=100,
        max_scale_down_step=1,
        max_scale_down_percent=100,
    )
    s = Stabilizer(hpa)
    assert s.recommend(0.0, 50, current=10) == 20  # 100% of 10
    assert s.recommend(5.0, 50, current=20) == 20  # the period's 100% is spent
    assert s.recommend(16.0, 50, current=20) == 40  # a new period: 100% of 20
    assert s.recommend(31.0, 50, current=40) == 50
    assert s.recommend(200.0, 5, current=50) == 50  # down: the 300 s window holds 50
    assert s.recommend(332.0, 5, current=50) == 5  # then all the way, in one step
    # A period of 0 keeps the per-decision steps (the autoscaler's defaults).
    per = Stabilizer(AutoscalerConfig(max_replicas=100, max_scale_up_step=4))
    assert per.recommend(0.0, 50, current=10) == 14
    assert per.recommend(1.0, 50, current=14) == 18
    # Down by percent: 50% of the period's start, at most.
    half = Stabilizer(
        AutoscalerConfig(
            max_replicas=100, scale_down_window_s=0, scale_period_s=15, max_scale_down_percent=50
        )
    )
    assert half.recommend(0.0, 10, current=40) == 20
    assert half.recommend(5.0, 10, current=20) == 20
    assert half.recommend(16.0, 10, current=20) == 10


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale_period_s": -1},
        {"max_scale_down_percent": 120},
        {"batch_margin_s": -1},
        {"batch_window_s": -5},
    ],
)
def test_config_refuses_bad_batch_and_rate_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AutoscalerConfig(**kwargs)  # type: ignore[arg-type]
