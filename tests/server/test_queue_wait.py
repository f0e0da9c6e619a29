"""Admission's wait estimate as pure objects: the throughput meter, the backlog, the refusal."""

from __future__ import annotations

import pytest

from surge.engine.throughput import ThroughputMeter
from surge.server.admission import AdmissionController
from surge.server.errors import RateLimitError
from surge.server.queue_wait import Backlog, EngineShape, Work


def test_meter_counts_busy_time_only_and_keeps_the_last_pace_while_idle() -> None:
    meter = ThroughputMeter(window_s=1.0)
    assert meter.step_s is None and meter.tokens_per_s is None
    meter.observe(0.0, 0, 0, busy=True)
    for i in range(1, 4):
        meter.observe(i / 10, 100 * i, i, busy=True)  # 0.1 s steps of 100 tokens
    meter.observe(0.4, 400, 4, busy=False)  # the step that emptied the engine counts
    meter.observe(50.0, 400, 4, busy=True)  # 49.6 idle seconds: not counted
    assert meter.step_s == pytest.approx(0.1) and meter.tokens_per_s == pytest.approx(1000.0)
    for i in range(1, 30):
        meter.observe(50.0 + i / 20, 400 + 10 * i, 4 + i, busy=True)  # 0.05 s steps now
    assert meter.step_s == pytest.approx(0.05)  # the window forgot the slower steps
    meter.observe(60.0, 0, 0, busy=True)  # a restarted engine: counters from zero, no sample
    assert meter.step_s == pytest.approx(0.05)


def test_free_slots_wait_for_prefill_steps_and_a_full_batch_for_decode_steps() -> None:
    shape = EngineShape(max_num_seqs=2, max_batched_tokens=100)
    backlog = Backlog()
    w = Work(prompt_tokens=150, decode_limit=50)
    assert backlog.estimate_s(w, shape, None) is None  # nothing measured: count caps only
    assert backlog.estimate_s(w, shape, 0.01) == 0.0  # nothing ahead: it starts at once
    for _ in range(2):
        backlog.add(w)
        backlog.start(w)
    # Batch full: one slot to wait for (50 decode tokens over 2 slots: 25 steps).
    assert backlog.estimate_s(w, shape, 0.01) == pytest.approx(0.25)
    backlog.add(w)  # one queued ahead: its prompt (98 tokens a step: 2), and two slots
    assert backlog.estimate_s(w, shape, 0.01) == pytest.approx((2 + 50) * 0.01)
    backlog.observe_length(10.0)  # sequences stop early: a slot costs what they generate
    assert backlog.estimate_s(w, shape, 0.01) == pytest.approx((2 + 10) * 0.01)


def test_the_kv_pool_can_hold_fewer_sequences_than_max_num_seqs() -> None:
    backlog = Backlog()
    w = Work(prompt_tokens=100, decode_limit=100)
    backlog.add(w)
    backlog.start(w)
    roomy = EngineShape(max_num_seqs=8, max_batched_tokens=1000)
    tight = EngineShape(max_num_seqs=8, max_batched_tokens=1000, kv_tokens=250)
    assert backlog.estimate_s(w, roomy, 0.01) == 0.0
    assert backlog.estimate_s(w, tight, 0.01) == pytest.approx(1.0)  # one 200-token slot


def test_policies_decide_who_is_ahead() -> None:
    backlog = Backlog()
    for _ in range(10):
        backlog.add(Work(prompt_tokens=10, priority=5, tenant="flood"))
    backlog.add(Work(prompt_tokens=10, priority=0, tenant="me"))
    urgent_mine = Work(prompt_tokens=10, priority=0, tenant="me")
    assert backlog.ahead(urgent_mine, "fcfs") == (11, 110)
    assert backlog.ahead(urgent_mine, "priority") == (1, 10)  # the flood is less urgent
    # Fair share: the other tenant gets a turn per turn of ours (two of ours with this one).
    assert backlog.ahead(urgent_mine, "fair") == (3, 30)
    assert backlog.ahead(urgent_mine, "priority-fair") == (1, 10)


def test_release_returns_the_backlog_to_empty() -> None:
    backlog = Backlog()
    a, b = Work(100, seqs=2, decode_limit=10), Work(50, tenant="t", priority=1)
    backlog.add(a)
    backlog.add(b)
    backlog.start(a)
    backlog.release(a, started=True)
    backlog.release(b, started=False)
    assert backlog.running_seqs == 0 and backlog.ahead(Work(1), "fcfs") == (0, 0)


def test_controller_refuses_past_the_bound_with_the_estimate_as_retry_after() -> None:
    ac = AdmissionController(max_queued_requests=100)
    ac.shape = EngineShape(max_num_seqs=1)
    w = Work(prompt_tokens=10, decode_limit=1000)
    first = ac.admit(10, work=w, max_wait_s=5.0, step_s=0.01)
    assert first.estimate_s == 0.0
    first.mark_started()
    # Behind a 1000-step decode at 10 ms a step: about 10 s, over the 5 s bound.
    with pytest.raises(RateLimitError, match="estimated wait") as info:
        ac.admit(10, work=w, max_wait_s=5.0, step_s=0.01)
    assert info.value.code == "queue_wait_exceeded" and info.value.status_code == 429
    assert info.value.headers["Retry-After"] == "10"  # 1000 steps of 10 ms
    assert ac.pending_requests == 0 and ac.in_flight == 1  # the refusal left nothing behind
    ac.admit(10, work=w, max_wait_s=60.0, step_s=0.01)  # a looser bound admits it
    ac.admit(10, work=w, max_wait_s=None, step_s=0.01)  # no bound: count caps only
    ac.admit(10, work=w, max_wait_s=5.0, step_s=None)  # nothing measured: count caps only
