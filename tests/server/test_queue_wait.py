"""Admission's wait estimate as pure objects: the step-cost model, the backlog, the refusal."""

from __future__ import annotations

import pytest

from surge.engine.client.step_cost import StepCostModel
from surge.server.admission import AdmissionController
from surge.server.errors import RateLimitError
from surge.server.queue_wait import Backlog, EngineShape, StepCost, Work


def flat(seconds: float) -> StepCost:
    """Every step costs the same, whatever its shape."""
    return lambda tokens, rows: seconds


def test_step_cost_model_recovers_a_known_cost_and_extrapolates_to_a_full_batch() -> None:
    def true(tokens: int, rows: int) -> float:
        return 0.004 + 0.0002 * tokens + 0.0015 * rows

    shapes = [(512, 1), (512, 1), (512, 64), (64, 64), (64, 64), (128, 128)]
    model = StepCostModel([(t, r, true(t, r)) for t, r in shapes])
    assert model.ready
    assert model.seconds(256, 256) == pytest.approx(true(256, 256), rel=1e-6)
    assert model.seconds(512, 5) == pytest.approx(true(512, 5), rel=1e-6)


def test_step_cost_model_is_not_tipped_by_look_alike_steps_and_never_goes_negative() -> None:
    def true(tokens: int, rows: int) -> float:
        return 0.004 + 0.0002 * tokens + 0.0015 * rows

    model = StepCostModel([(t, r, true(t, r)) for t, r in [(512, 1), (64, 64), (512, 64)]])
    # A long run of decode-only steps (tokens = rows): collinear, 10% slower than calibrated.
    model.observe([(n, n, 1.1 * true(n, n)) for n in [16, 32, 48, 64] * 64])
    assert model.seconds(48, 48) == pytest.approx(1.1 * true(48, 48), rel=0.05)
    assert model.seconds(512, 1) == pytest.approx(true(512, 1), rel=0.2)  # prefill still known
    # Noise that fits a negative term: the term is dropped, a bigger step never costs less.
    noisy = StepCostModel([(10, 10, 0.5), (20, 20, 0.1), (30, 30, 0.3), (40, 1, 0.2)])
    assert noisy.coef is not None and (noisy.coef >= 0).all()
    assert noisy.seconds(1000, 1000) >= noisy.seconds(10, 10)


def test_step_cost_model_without_calibration_waits_for_steps() -> None:
    model = StepCostModel()
    assert not model.ready and model.seconds(100, 10) == 0.0
    model.observe([(100, 1, 0.1), (10, 10, 0.02)])
    assert not model.ready
    model.observe([(50, 50, 0.06)])
    assert model.ready and model.seconds(100, 1) == pytest.approx(0.1, rel=0.1)


def test_a_full_batch_step_costs_more_than_the_first_small_steps() -> None:
    """The burst case: behind a full batch the wait is priced at the full batch's step."""
    shape = EngineShape(max_num_seqs=4, max_batched_tokens=100)
    backlog = Backlog()
    w = Work(prompt_tokens=10, decode_limit=8)
    for _ in range(4):
        backlog.add(w)
        backlog.start(w)
    calls: list[tuple[int, int]] = []

    def cost(tokens: int, rows: int) -> float:
        calls.append((tokens, rows))
        return 0.001 * rows

    # Batch full: one slot, 8 decode steps over 4 slots = 2 steps of 4 rows.
    assert backlog.estimate_s(w, shape, cost) == pytest.approx(2 * 0.004)
    assert calls == [(4, 4)]
    backlog.add(w)  # a prompt ahead: one prefill step of the whole budget beside 4 rows
    calls.clear()
    assert backlog.estimate_s(w, shape, cost) == pytest.approx(0.005 + 4 * 0.004)
    assert calls == [(100, 5), (4, 4)]


def test_free_slots_wait_for_prefill_steps_and_a_full_batch_for_decode_steps() -> None:
    shape = EngineShape(max_num_seqs=2, max_batched_tokens=100)
    backlog = Backlog()
    w = Work(prompt_tokens=150, decode_limit=50)
    assert backlog.estimate_s(w, shape, None) is None  # nothing measured: count caps only
    assert backlog.estimate_s(w, shape, flat(0.01)) == 0.0  # nothing ahead: it starts at once
    for _ in range(2):
        backlog.add(w)
        backlog.start(w)
    # Batch full: one slot to wait for (50 decode tokens over 2 slots: 25 steps).
    assert backlog.estimate_s(w, shape, flat(0.01)) == pytest.approx(0.25)
    backlog.add(w)  # one queued ahead: its prompt (98 tokens a step: 2), and two slots
    assert backlog.estimate_s(w, shape, flat(0.01)) == pytest.approx((2 + 50) * 0.01)
    backlog.observe_length(10.0)  # sequences stop early: a slot costs what they generate
    assert backlog.estimate_s(w, shape, flat(0.01)) == pytest.approx((2 + 10) * 0.01)


def test_the_kv_pool_can_hold_fewer_sequences_than_max_num_seqs() -> None:
    backlog = Backlog()
    w = Work(prompt_tokens=100, decode_limit=100)
    backlog.add(w)
    backlog.start(w)
    roomy = EngineShape(max_num_seqs=8, max_batched_tokens=1000)
    tight = EngineShape(max_num_seqs=8, max_batched_tokens=1000, kv_tokens=250)
    assert backlog.estimate_s(w, roomy, flat(0.01)) == 0.0
    assert backlog.estimate_s(w, tight, flat(0.01)) == pytest.approx(1.0)  # one 200-token slot


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
    first = ac.admit(10, work=w, max_wait_s=5.0, step_cost=flat(0.01))
    assert first.estimate_s == 0.0
    first.mark_started()
    # Behind a 1000-step decode at 10 ms a step: about 10 s, over the 5 s bound.
    with pytest.raises(RateLimitError, match="estimated wait") as info:
        ac.admit(10, work=w, max_wait_s=5.0, step_cost=flat(0.01))
    assert info.value.code == "queue_wait_exceeded" and info.value.status_code == 429
    assert info.value.headers["Retry-After"] == "10"  # 1000 steps of 10 ms
    assert ac.pending_requests == 0 and ac.in_flight == 1  # the refusal left nothing behind
    ac.admit(10, work=w, max_wait_s=60.0, step_cost=flat(0.01))  # a looser bound admits it
    ac.admit(10, work=w, max_wait_s=None, step_cost=flat(0.01))  # no bound: count caps only
    ac.admit(10, work=w, max_wait_s=5.0, step_cost=None)  # nothing measured: count caps only
