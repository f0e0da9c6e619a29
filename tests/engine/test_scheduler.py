"""Scheduler on plain data: exact batches, chunked prefill, admission, preemption order, aborts."""

from __future__ import annotations

import random

from surge.engine.client.outputs import FinishReason
from surge.engine.config import SchedulerConfig
from surge.engine.core.batch import SampledToken, SampledTokens, SchedulerOutput
from surge.engine.core.block_manager import BlockManager
from surge.engine.core.policies import FCFSPolicy
from surge.engine.core.request import Request, RequestStatus
from surge.engine.core.scheduler import Scheduler
from surge.sampling_params import SamplingParams

BS = 4  # block size


def make_scheduler(
    num_blocks: int = 16, budget: int = 32, max_seqs: int = 8, caching: bool = True
) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget)
    return Scheduler(config, BlockManager(num_blocks, BS, caching), FCFSPolicy())


def make_request(req_id: str, prompt: list[int], arrival_s: float, max_tokens: int = 8) -> Request:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return Request(req_id, prompt, params, arrival_s, seed=0, max_tokens=max_tokens, block_size=BS)


def step(s: Scheduler, now: float = 0.0, token: int = 7) -> SchedulerOutput:
    """Schedule, pretend the model sampled `token` for every row that samples, update."""
    out = s.schedule(now)
    sampled = {
        r.req_id: SampledToken(token, None, None) for r in out.requests if r.sampling is not None
    }
    s.update(out, SampledTokens(sampled))
    return out


def shape(out: SchedulerOutput) -> list[tuple[str, int, int]]:
    return [(r.req_id, r.start_pos, len(r.token_ids)) for r in out.requests]


def test_decodes_and_new_prefills_share_one_step() -> None:
    s = make_scheduler(budget=16)
    s.add(make_request("a", list(range(10)), 0.0))
    assert shape(step(s)) == [("a", 0, 10)]  # whole prompt fits the budget
    s.add(make_request("b", list(range(100, 120)), 1.0))
    # a decodes (1 token) and b's prefill is chunked to the 15 tokens left of the budget.
    assert shape(step(s)) == [("a", 10, 1), ("b", 0, 15)]
    out = step(s)
    assert shape(out) == [("a", 11, 1), ("b", 15, 5)]
    # Only the chunk that reaches the end of b's prompt samples.
    assert [r.sampling is not None for r in out.requests] == [True, True]
    assert s.requests["b"].output_token_ids == [7]


def test_chunked_prefill_samples_only_on_last_chunk() -> None:
    s = make_scheduler(budget=4)
    s.add(make_request("a", list(range(10)), 0.0))
    outs = [step(s) for _ in range(3)]
    assert [shape(o) for o in outs] == [[("a", 0, 4)], [("a", 4, 4)], [("a", 8, 2)]]
    assert [o.requests[0].sampling is not None for o in outs] == [False, False, True]
    assert s.requests["a"].num_computed_tokens == 10
    assert s.requests["a"].output_token_ids == [7]


def test_max_num_seqs_caps_running() -> None:
    s = make_scheduler(max_seqs=2, budget=64)
    for i in range(3):
        s.add(make_request(f"r{i}", [1, 2, 3], float(i)))
    out = step(s)
    assert [r.req_id for r in out.requests] == ["r0", "r1"]
    assert s.num_running == 2 and s.num_waiting == 1
    s.finish("r0", FinishReason.STOP)
    out = step(s)
    assert [r.req_id for r in out.requests] == ["r1", "r2"]


def test_prefix_hit_skips_cached_tokens() -> None:
    s = make_scheduler(budget=64)
    prompt = list(range(12))
    s.add(make_request("a", prompt, 0.0))
    step(s)
    s.add(make_request("b", [*prompt, 99], 1.0))
    out = step(s)
    # b reuses a's 3 full blocks (12 tokens) and computes only its last token.
    assert ("b", 12, 1) in shape(out)
    assert s.requests["b"].num_cached_tokens == 12


def test_preemption_takes_latest_arrival_and_output_is_kept() -> None:
    # 4 blocks of 4 slots: two requests of 6 prompt tokens (2 blocks each) fill the pool.
    s = make_scheduler(num_blocks=4, budget=64, caching=False)
    s.add(make_request("old", [1, 2, 3, 4, 5, 6], 0.0, max_tokens=8))
    s.add(make_request("new", [9, 8, 7, 6, 5, 4], 1.0, max_tokens=8))
    for _ in range(3):
        step(s)  # prefill, then two decodes: 8 slots (2 blocks) each, the pool is full
    out = step(s)  # the 9th slot of "old" needs a 3rd block: "new" (latest arrival) is preempted
    assert out.preempted == ("new",)
    assert shape(out) == [("old", 8, 1)]
    new = s.requests["new"]
    assert new.status is RequestStatus.WAITING and new.num_computed_tokens == 0
    assert new.output_token_ids == [7, 7, 7]  # its output survives and is recomputed later
    # Once "old" finishes, "new" resumes with prompt + output recomputed as one prefill.
    s.finish("old", FinishReason.STOP)
    out = step(s)
    assert shape(out) == [("new", 0, 9)]
    assert s.blocks.usage() > 0


def test_abort_anywhere_frees_everything() -> None:
    s = make_scheduler(budget=8)
    s.add(make_request("a", list(range(20)), 0.0))
    s.add(make_request("b", list(range(5)), 1.0))
    step(s)  # a is mid-prefill, b waits
    s.finish("a", FinishReason.ABORT)
    s.finish("b", FinishReason.ABORT)
    assert s.finish("b", FinishReason.ABORT) is None  # twice is harmless
    assert not s.has_work()
    assert s.blocks.usage() == 0.0
    assert s.blocks.num_free_blocks == s.blocks.num_blocks


def test_random_operations_never_leak_blocks() -> None:
    rng = random.Random(0)
    s = make_scheduler(num_blocks=24, budget=24, max_seqs=6)
    live: list[str] = []
    for i in range(1000):
        op = rng.random()
        if op < 0.3:
            prompt = [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
            rid = f"r{i}"
            s.add(make_request(rid, prompt, float(i), max_tokens=rng.randrange(1, 12)))
            live.append(rid)
        elif op < 0.4 and live:
            s.finish(live.pop(rng.randrange(len(live))), FinishReason.ABORT)
        else:
            step(s, now=float(i), token=rng.randrange(5))
            for rid in list(live):
                req = s.requests.get(rid)
                if req is not None and req.output_token_ids and req.stop_reason((99,)):
                    s.finish(rid, FinishReason.LENGTH)
                    live.remove(rid)
        s.blocks.check_invariants()
        running_blocks = sum(len(s.blocks.block_table(r.req_id)) for r in s.running)
        assert running_blocks <= s.blocks.num_blocks
    for rid in live:
        s.finish(rid, FinishReason.ABORT)
    assert s.blocks.usage() == 0.0
    assert s.blocks.num_free_blocks == s.blocks.num_blocks
