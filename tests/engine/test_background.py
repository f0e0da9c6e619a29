"""Background work behind urgent work (engine/core/background.py), through the real scheduler on
plain data with a driven clock: batch-priority lines sit out an interactive request's prefill
step and resume after it, share a bounded slice of each step while interactive work is present,
and run whole steps alone; equal priorities schedule exactly as without the rules."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

import pytest

from surge.engine.client.outputs import FinishReason
from surge.engine.config import SchedulerConfig
from surge.engine.core.background import Background, StepPlan
from surge.engine.core.batch import SampledToken, SampledTokens, SchedulerOutput
from surge.engine.core.block_manager import BlockManager
from surge.engine.core.policies import make_policy
from surge.engine.core.request import Request, RequestStatus
from surge.engine.core.scheduler import Scheduler
from surge.sampling_params import SamplingParams

BS = 4
BATCH = 2**31 - 1  # the Batch API's priority (surge/batch/config.py BATCH_PRIORITY)
# Exact step costs, seconds = 5 ms + 1 ms a token + 2 ms a row: a decode row costs 3 ms.
COSTS = [(1, 1, 0.008), (65, 1, 0.072), (64, 64, 0.197), (10, 10, 0.035)]


def scheduler(
    policy: str = "priority", budget: int = 64, max_seqs: int = 16, **kw: object
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        policy=policy,
        **kw,  # type: ignore[arg-type]
    )
    return Scheduler(config, BlockManager(1024, BS, True), make_policy(config))


def priced(s: Scheduler) -> Scheduler:
    s.background.calibrate(COSTS)
    return s


def request(
    rid: str, arrival_s: float, priority: int = 0, prompt_len: int = 8, max_tokens: int = 40
) -> Request:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prompt = [hash((rid, i)) % 1000 + 10 for i in range(prompt_len)]
    return Request(rid, prompt, params, arrival_s, 0, max_tokens, BS, priority=priority)


def step(s: Scheduler, now_s: float) -> SchedulerOutput:
    """One engine step; finishes the requests that reach their max_tokens."""
    out = s.schedule(now_s)
    sampled = {r.req_id: SampledToken(7, None, None) for r in out.requests if r.sampling}
    s.update(out, SampledTokens(sampled))
    for rid in sampled:
        req = s.requests[rid]
        if req.num_output_tokens >= req.max_tokens:
            s.finish(rid, FinishReason.LENGTH)
    return out


def ids(out: SchedulerOutput) -> list[str]:
    return [r.req_id for r in out.requests]


def start_batch(s: Scheduler, n: int, now_s: float = 0.0, max_tokens: int = 40) -> list[str]:
    names = [f"line-{i}" for i in range(n)]
    for i, name in enumerate(names):
        s.add(request(name, now_s + i * 1e-3, BATCH, max_tokens=max_tokens))
    while any(s.requests[n].num_output_tokens == 0 for n in names):
        step(s, now_s)
    return names


def test_arrival_is_prefilled_alone_and_the_batch_resumes_next_step() -> None:
    s = scheduler()  # no step costs known: the hold alone
    lines = start_batch(s, 6)
    assert ids(step(s, 1.0)) == lines  # all decode together
    before = {n: s.requests[n].num_output_tokens for n in lines}
    s.add(request("chat", 1.05, prompt_len=12))
    out = step(s, 1.1)
    # Its prefill step holds none of the batch rows, preempts none, and it has its first token.
    assert ids(out) == ["chat"] and out.preempted == ()
    assert s.requests["chat"].num_output_tokens == 1
    for n in lines:  # held, not preempted: slot, blocks and output kept
        assert s.requests[n].status is RequestStatus.RUNNING
        assert s.requests[n].num_output_tokens == before[n]
        assert s.requests[n].num_computed_tokens > 0
    assert ids(step(s, 1.2)) == ["chat", *lines]  # everyone decodes again


def test_a_long_prompt_holds_the_batch_for_each_of_its_chunks() -> None:
    s = scheduler(budget=16)
    lines = start_batch(s, 4)
    s.add(request("chat", 1.0, prompt_len=40))  # three chunks of 16, 16, 8
    shapes = [[(r.req_id, len(r.token_ids)) for r in step(s, 1.0 + i * 0.1).requests]
              for i in range(3)]  # fmt: skip
    assert shapes == [[("chat", 16)], [("chat", 16)], [("chat", 8)]]
    assert ids(step(s, 1.4)) == ["chat", *lines]


def test_waiting_batch_lines_are_not_admitted_into_a_held_step() -> None:
    s = scheduler()
    lines = start_batch(s, 2)
    s.add(request("chat", 1.0))
    s.add(request("late-line", 1.0, BATCH))
    assert ids(step(s, 1.0)) == ["chat"]
    assert s.requests["late-line"].status is RequestStatus.WAITING
    assert ids(step(s, 1.1)) == ["chat", *lines, "late-line"]


def test_batch_rows_get_a_bounded_slice_while_interactive_work_runs() -> None:
    # 10.5 ms of background a step at 3 ms a decode row: three batch rows join each step.
    s = priced(scheduler(background_step_ms=10.5))
    lines = start_batch(s, 8)
    assert len(ids(step(s, 1.0))) == 8  # alone: whole steps
    s.add(request("chat", 2.0, max_tokens=30))
    assert ids(step(s, 2.0)) == ["chat"]  # its prefill step: held
    for i in range(5):
        assert ids(step(s, 2.1 + i * 0.1)) == ["chat", *lines[:3]]


def test_the_slice_always_moves_one_row() -> None:
    s = priced(scheduler(background_step_ms=0.001))  # smaller than any row
    lines = start_batch(s, 4)
    s.add(request("chat", 1.0, max_tokens=30))
    step(s, 1.0)
    for i in range(4):
        assert ids(step(s, 1.1 + i * 0.1)) == ["chat", lines[0]]


def test_a_sliced_prefill_chunk_is_cut_to_the_time_left() -> None:
    # 20.5 ms: 2 ms for the row and 18 tokens at 1 ms, for a waiting line's 30-token prompt.
    s = priced(scheduler(background_step_ms=20.5))
    s.add(request("chat", 0.0, max_tokens=50))
    step(s, 0.0)
    s.add(request("line", 0.5, BATCH, prompt_len=30))
    out = step(s, 1.0)
    assert [(r.req_id, len(r.token_ids)) for r in out.requests] == [("chat", 1), ("line", 18)]
    out = step(s, 1.1)
    assert [(r.req_id, len(r.token_ids)) for r in out.requests] == [("chat", 1), ("line", 12)]


def test_batch_alone_after_the_quiet_time_runs_whole_steps_again() -> None:
    s = priced(scheduler(max_seqs=32, background_step_ms=10.5, background_quiet_s=5.0))
    lines = start_batch(s, 20, max_tokens=200)
    s.add(request("chat", 1.0, max_tokens=3))
    t = 1.0
    while "chat" in s.requests:
        step(s, t)
        t += 0.1
    # The interactive request is gone, but more may come: a slice stays for the quiet time,
    # IDLE_SLICES of them with nothing urgent present (42 ms at 3 ms a row: 14 rows).
    assert ids(step(s, t + 4.0)) == lines[:14]
    assert ids(step(s, t + 5.5)) == lines


def test_a_batch_that_starts_just_after_interactive_work_is_background_at_once() -> None:
    # 2.5 ms, 10 ms with nothing urgent present: one 8-token prefill (2 + 8 ms) a step.
    s = priced(scheduler(background_step_ms=2.5, background_quiet_s=5.0))
    s.add(request("chat", 0.0, max_tokens=3))
    for i in range(4):
        step(s, i * 0.1)  # interactive work alone, then gone
    assert not s.has_work()
    for i in range(12):  # 2 s later, within the quiet time, alone in the engine
        s.add(request(f"line-{i}", 2.0, BATCH))
    assert ids(step(s, 2.0)) == ["line-0"]  # a slice, not a whole step
    # Quiet since 0.2 s: whole steps (the 64-token budget: the next 8 prompts, and line-0).
    assert len(step(s, 5.5).requests) == 9


def test_the_slice_shrinks_as_urgent_rows_grow_past_busy_rows() -> None:
    # 21 ms: 7 batch rows beside up to BUSY_ROWS (4) chats; beside 8 chats, half: 3 rows.
    s = priced(scheduler(max_seqs=32, background_step_ms=21.0))
    lines = start_batch(s, 12, max_tokens=200)
    for n, rows in ((4, 7), (8, 3)):
        for i in range(n - len([r for r in s.requests if r.startswith("chat")])):
            s.add(request(f"chat-{n}-{i}", 1.0, max_tokens=100))
        step(s, 1.0)  # their prefill: the batch held
        out = ids(step(s, 1.1))
        assert all(r.startswith("chat") for r in out[:n]) and out[n:] == lines[:rows]


def test_no_line_starves_and_all_finish_under_steady_interactive_traffic() -> None:
    s = priced(scheduler(background_step_ms=10.5))
    lines = start_batch(s, 8, max_tokens=20)
    done: set[str] = set()
    for i in range(400):
        now = 1.0 + i * 0.1
        if i % 10 == 0:  # an interactive request every tenth step, each a few steps long
            s.add(request(f"chat-{i}", now, max_tokens=6))
        step(s, now)
        done |= {n for n in lines if n not in s.requests}
    assert done == set(lines)


@pytest.mark.parametrize("aging_s", [1.0, None])
def test_an_aged_request_is_not_background(aging_s: float | None) -> None:
    # Priority 2 that arrived 3 s ago, with 1 s of aging a level, outranks fresh priority-0
    # work: it keeps running through the newcomer's prefill. Without aging it sits it out.
    s = scheduler(priority_aging_s=aging_s)
    s.add(request("old", 0.0, priority=2))
    step(s, 0.0)
    s.add(request("fresh", 3.0))
    assert ids(step(s, 3.0)) == (["old", "fresh"] if aging_s else ["fresh"])


class Off(Background):
    """The rules turned off: every step planned as if no request were background."""

    def plan(
        self, running: Iterable[Request], waiting: Iterable[Request], now_s: float
    ) -> StepPlan:
        return StepPlan()


@pytest.mark.parametrize("policy", ["priority", "priority-fair", "fcfs", "fair"])
def test_equal_priorities_schedule_exactly_as_without_the_rules(policy: str) -> None:
    rng = random.Random(3)
    arrivals = [(f"r{i}", i * 0.05, rng.randint(4, 40), rng.randint(1, 30)) for i in range(120)]
    runs = []
    for on in (True, False):
        s = priced(scheduler(policy, budget=32, max_seqs=6, background_step_ms=10.5))
        if not on:
            s.background = Off(s.config, s.policy)
        shapes = []
        pending = list(arrivals)
        for i in range(3000):
            now = i * 0.02
            while pending and pending[0][1] <= now:
                rid, t, p, m = pending.pop(0)
                s.add(request(rid, t, prompt_len=p, max_tokens=m))
            if not pending and not s.has_work():
                break
            out = step(s, now)
            shapes.append([(r.req_id, r.start_pos, len(r.token_ids)) for r in out.requests])
        assert not pending and not s.has_work()
        runs.append(shapes)
    assert runs[0] == runs[1]


# ---- in the real engine (the tiny random Llama) ------------------------------------------------


def test_engine_prefills_an_arrival_alone_and_lines_keep_their_tokens(tiny_model_dir: Path) -> None:
    from surge.engine.client.outputs import EngineCoreRequest
    from surge.engine.config import CacheConfig, EngineConfig, ModelConfig
    from surge.engine.core.engine_core import EngineCore

    engine = EngineCore(
        EngineConfig(
            ModelConfig(model=str(tiny_model_dir), dtype="float32"),
            CacheConfig(block_size=BS, num_blocks=256),
            SchedulerConfig(policy="priority", background_step_ms=1e6),  # the hold alone
        )
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def prompt(start: int) -> list[int]:
        return [100 + (start * 37 + i * 11) % 500 for i in range(10)]

    def run(with_chat: bool) -> dict[str, list[int]]:
        engine.blocks.reset_prefix_cache()
        tokens: dict[str, list[int]] = {}
        for i in range(4):
            engine.add_request(EngineCoreRequest(f"line-{i}", prompt(i), greedy, priority=BATCH))
        for n in range(40):
            if n == 3 and with_chat:
                engine.add_request(EngineCoreRequest("chat", prompt(9), greedy))
            outs = engine.step()
            if n == 3 and with_chat:  # the arrival's step: its first token, nobody else's
                assert [o.req_id for o in outs] == ["chat"]
            for o in outs:
                tokens.setdefault(o.req_id, []).extend(o.new_token_ids)
            if not engine.has_work():
                break
        assert not engine.has_work()
        return tokens

    alone, shared = run(False), run(True)
    assert {k: v for k, v in shared.items() if k != "chat"} == alone
    assert len(shared["chat"]) == 12
    assert engine.scheduler.background.step_cost.ready  # priced by the engine's own steps
