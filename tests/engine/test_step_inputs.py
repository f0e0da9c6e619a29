"""The step-tensor builder (surge/engine/runner/step_inputs.py) on real SchedulerOutputs of an
EngineCore on the tiny model, in process: mixed decode + prefill steps, a chunked prefill,
padding, prompt scoring and LoRA rows, every position, slot and table against values worked out
by hand; and the step paths' `accepts`, which decides which of them runs each step."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import torch

from surge.engine.client.outputs import EngineCoreRequest
from surge.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from surge.engine.core.batch import SchedulerOutput
from surge.engine.core.engine_core import EngineCore
from surge.engine.runner.cuda_graphs import DecodeGraphs
from surge.engine.runner.step_inputs import StepLayout
from surge.engine.runner.step_paths import (
    CompiledPath,
    CudaGraphPath,
    EagerPath,
    FusedStackPath,
    StepBatch,
)
from surge.models.q4_decode import FusedQ4Decode
from surge.sampling_params import SamplingParams

BS = 4  # block size
NUM_BLOCKS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
A = [100 + i for i in range(10)]  # prompts: token ids of the tiny model's vocabulary
B = [200 + i for i in range(20)]


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[EngineCore]:
    """A 16-token step budget; no kernels, so the builder makes the decode mask itself."""
    config = EngineConfig(
        model=ModelConfig(model=str(tiny_model_dir), dtype="float32", use_kernels=False),
        cache=CacheConfig(block_size=BS, num_blocks=NUM_BLOCKS, enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16),
    )
    yield EngineCore(config)


def schedule(eng: EngineCore) -> SchedulerOutput:
    return eng.scheduler.schedule(time.monotonic())


def advance(eng: EngineCore, batch: SchedulerOutput) -> None:
    """Run a scheduled step to its end, as EngineCore.step does."""
    eng.scheduler.update(batch, eng.runner.run(batch))


def add(eng: EngineCore, req_id: str, prompt: list[int], **params: object) -> None:
    p = dataclasses.replace(GREEDY, **params)  # type: ignore[arg-type]
    eng.add_request(EngineCoreRequest(req_id, prompt, p))


def slot(table: tuple[int, ...], pos: int) -> int:
    return table[pos // BS] * BS + pos % BS


def mixed_step(eng: EngineCore) -> SchedulerOutput:
    """a (10-token prompt) prefilled and decoding; b (20 tokens) starting: a's decode and b's
    first 15-token chunk share the 16-token budget."""
    add(eng, "a", A)
    advance(eng, schedule(eng))
    add(eng, "b", B)
    batch = schedule(eng)
    shape = [(r.req_id, r.start_pos, len(r.token_ids)) for r in batch.requests]
    assert shape == [("a", 10, 1), ("b", 0, 15)]
    return batch


def ints(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.flatten().tolist()]


def test_mixed_decode_and_chunked_prefill(engine: EngineCore) -> None:
    batch = mixed_step(engine)
    a, b = batch.requests
    # Fresh pool, no caching: a holds blocks 0-2 (11 tokens), b 3-6 (its 15 tokens' 4 blocks).
    assert a.block_table == (0, 1, 2) and b.block_table == (3, 4, 5, 6)
    x = engine.runner.builder.build(batch, StepLayout())
    assert ints(x.input_ids) == [a.token_ids[0], *B[:15]]
    assert ints(x.positions) == [10, *range(15)]
    # a's token 10: block 2, offset 2; b's tokens 0-14 in blocks 3, 4, 5, 6.
    assert ints(x.attn.slot_mapping) == [2 * 4 + 2, *range(12, 27)]
    assert ints(x.attn.slot_mapping) == [slot(a.block_table, 10)] + [
        slot(b.block_table, p) for p in range(15)
    ]
    # Only a samples: b's chunk ends before its prompt does.
    assert x.sample_reqs == [a] and ints(x.attn.logits_indices) == [0]
    assert x.scored == [] and x.row_slots is None and x.requests == batch.requests
    # The decode: a's table, its length 11, masked past it (3 blocks = 12 keys).
    assert ints(x.attn.decode_block_tables) == [0, 1, 2]
    assert ints(x.attn.decode_seq_lens) == [11]
    assert x.attn.decode_bias.shape == (1, 1, 12)
    assert x.attn.decode_bias.flatten().tolist() == [0.0] * 11 + [-math.inf]
    assert x.attn.decode_bias_window is None
    # The prefill: one chunk after the decode row, over the blocks its 15 tokens fill.
    (chunk,) = x.attn.prefills
    assert (chunk.query_start, chunk.query_len, chunk.start_pos) == (1, 15, 0)
    assert ints(chunk.block_table) == [3, 4, 5, 6]
    advance(engine, batch)

    # b's last chunk (positions 15-19) samples; a decodes at 11.
    batch = schedule(engine)
    a, b = batch.requests
    assert (a.start_pos, b.start_pos, len(b.token_ids)) == (11, 15, 5)
    assert b.block_table == (3, 4, 5, 6, 7)
    x = engine.runner.builder.build(batch, StepLayout())
    assert ints(x.input_ids) == [a.token_ids[0], *B[15:]]
    assert ints(x.positions) == [11, *range(15, 20)]
    assert ints(x.attn.slot_mapping) == [2 * 4 + 3, 27, 7 * 4, 29, 30, 31]
    assert x.sample_reqs == [a, b] and ints(x.attn.logits_indices) == [0, 5]
    (chunk,) = x.attn.prefills
    assert (chunk.query_start, chunk.query_len, chunk.start_pos) == (1, 5, 15)
    assert ints(chunk.block_table) == [3, 4, 5, 6, 7]

    # The same step with each chunk token as a decode row of its own (the fused stack's
    # layout): b's rows see its table and lengths 16..20; tables padded with block 0.
    rows = engine.runner.builder.build(batch, StepLayout(chunks_as_rows=True))
    assert rows.attn.prefills == ()
    assert ints(rows.input_ids) == ints(x.input_ids) and ints(rows.positions) == ints(x.positions)
    assert ints(rows.attn.decode_seq_lens) == [12, 16, 17, 18, 19, 20]
    assert rows.attn.decode_block_tables.tolist() == [[0, 1, 2, 0, 0]] + [[3, 4, 5, 6, 7]] * 5
    bias = rows.attn.decode_bias.squeeze(1)
    assert bias.shape == (6, 20)
    assert [int((r == 0).sum()) for r in bias] == [12, 16, 17, 18, 19, 20]


def test_padding_to_a_bucket(engine: EngineCore) -> None:
    """A pure-decode step padded to 4 rows: the padding writes the scratch slot (one block past
    the pool) and is sampled after the real rows; no mask when the layout asks for none."""
    for req_id, prompt in (("a", A), ("b", A[:5])):
        add(engine, req_id, prompt)
    advance(engine, schedule(engine))
    batch = schedule(engine)
    assert [r.is_decode for r in batch.requests] == [True, True]
    scratch = NUM_BLOCKS * BS
    assert engine.runner.scratch_slot == scratch
    x = engine.runner.builder.build(batch, StepLayout(pad_to=4, mask=False))
    a, b = batch.requests
    assert ints(x.positions) == [10, 5, 0, 0] and ints(x.input_ids)[2:] == [0, 0]
    assert (
        ints(x.attn.slot_mapping)
        == [slot(a.block_table, 10), slot(b.block_table, 5)] + [scratch] * 2
    )
    assert ints(x.attn.logits_indices) == [0, 1, 2, 3] and x.sample_reqs == [a, b]
    assert ints(x.attn.decode_seq_lens) == [11, 6, 1, 1]
    assert x.attn.decode_block_tables.tolist() == [
        [*a.block_table],
        [*b.block_table, 0],
        [NUM_BLOCKS, 0, 0],
        [NUM_BLOCKS, 0, 0],
    ]
    assert x.attn.decode_bias.numel() == 0


def test_prompt_scoring_and_lora_rows(engine: EngineCore) -> None:
    """Scored prompt rows' logits follow the sampled rows'; each row carries its adapter slot."""
    add(engine, "a", A)
    advance(engine, schedule(engine))
    add(engine, "s", A[:6], prompt_logprobs=2)
    batch = schedule(engine)
    a, s = batch.requests
    assert s.prompt_rows_start == 0 and s.prompt_targets == tuple(A[1:6])
    x = engine.runner.builder.build(batch, StepLayout(score=True))
    # Rows: a's decode (0), s's prompt (1-6). Sampled: a, s's last; then s's rows 1-5 scored.
    assert ints(x.attn.logits_indices) == [0, 6, 1, 2, 3, 4, 5]
    assert x.sample_reqs == [a, s] and x.scored == [s] * 5
    plain = engine.runner.builder.build(batch, StepLayout())
    assert ints(plain.attn.logits_indices) == [0, 6] and plain.scored == []
    # LoRA rows: in row order, decodes first, then the chunk token by token.
    requests = (dataclasses.replace(a, lora_slot=2), dataclasses.replace(s, lora_slot=0))
    lora = dataclasses.replace(batch, requests=requests)
    assert engine.runner.builder.build(lora, StepLayout(lora_slots=True)).row_slots == [2] + [0] * 6
    advance(engine, batch)


# ---- the step paths' choice ---------------------------------------------------------------------


@dataclasses.dataclass
class StackSize:
    """What FusedStackPath.accepts reads of a FusedQ4Decode (the tiny model's head size has no
    fused stack: tests/models/test_q4_decode.py runs the real one)."""

    max_rows: int = 8
    max_chunk: int = 4
    has_lora: bool = False


def step_of(batch: SchedulerOutput, scoring: bool = False, lora: bool = False) -> StepBatch:
    return StepBatch(batch, scoring, lora)


def decodes(eng: EngineCore, n: int) -> SchedulerOutput:
    for i in range(n):
        add(eng, f"d{i}", A[: 2 + i])
    advance(eng, schedule(eng))
    batch = schedule(eng)
    assert len(batch.requests) == n and all(r.is_decode for r in batch.requests)
    return batch


def test_fused_stack_accepts_small_steps_without_scoring(engine: EngineCore) -> None:
    batch = mixed_step(engine)  # 1 decode + a 15-token chunk
    path = FusedStackPath(cast(FusedQ4Decode, StackSize(max_rows=16, max_chunk=15)))
    assert path.accepts(step_of(batch))
    assert not path.accepts(step_of(batch, scoring=True))  # it makes sampled rows' logits only
    assert not path.accepts(step_of(batch, lora=True))  # no adapters set on the stack
    with_lora = FusedStackPath(cast(FusedQ4Decode, StackSize(16, 15, has_lora=True)))
    assert with_lora.accepts(step_of(batch, lora=True))
    assert not FusedStackPath(cast(FusedQ4Decode, StackSize(15, 15))).accepts(step_of(batch))
    assert not FusedStackPath(cast(FusedQ4Decode, StackSize(16, 14))).accepts(step_of(batch))
    assert path.layout(step_of(batch, lora=True)) == StepLayout(
        chunks_as_rows=True, lora_slots=True
    )


def test_graphs_and_compiled_take_pure_decodes_only(engine: EngineCore) -> None:
    batch = decodes(engine, 3)
    graphs = DecodeGraphs(
        engine.model, engine.runner.kv_caches, BS, 5, 3, 0, torch.device("cpu"), capture=False
    )
    compiled = CompiledPath(engine.model, torch.device("cpu"))  # compiles nothing until run
    for path in (CudaGraphPath(graphs), compiled):
        assert path.accepts(step_of(batch))
        assert not path.accepts(step_of(batch, scoring=True))  # base layers, sampled rows
        assert not path.accepts(step_of(batch, lora=True))
        assert path.layout(step_of(batch)).pad_to == 4
    assert CudaGraphPath(graphs).layout(step_of(batch)).mask is False
    assert compiled.layout(step_of(batch)).mask is True
    # A table past the graphs' widest (4 blocks: max_blocks 3, a power of two up) takes none.
    long = dataclasses.replace(batch.requests[0], block_table=(1, 2, 3, 4, 5))
    wide = dataclasses.replace(batch, requests=(long, *batch.requests[1:]))
    assert not CudaGraphPath(graphs).accepts(step_of(wide)) and compiled.accepts(step_of(wide))
    compiled.compiled = None  # a compile failed: eager from then on
    assert not compiled.accepts(step_of(batch))
    advance(engine, batch)
    add(engine, "p", B)
    mixed = schedule(engine)  # decodes and a prefill chunk
    assert not CudaGraphPath(graphs).accepts(step_of(mixed))
    assert not CompiledPath(engine.model, torch.device("cpu")).accepts(step_of(mixed))
    assert EagerPath(engine.model, torch.device("cpu")).accepts(step_of(mixed, True, True))


def test_the_runner_asks_the_paths_in_order(engine: EngineCore) -> None:
    runner = engine.runner
    assert [p.name for p in runner.paths] == ["eager"]  # CPU, no kernels, no compile
    batch = decodes(engine, 3)
    graphs = DecodeGraphs(
        engine.model, runner.kv_caches, BS, 8, 8, runner.scratch_slot, torch.device("cpu"), False
    )
    runner.use_paths(fused=cast(FusedQ4Decode, StackSize(max_rows=2)), graphs=graphs)
    assert [p.name for p in runner.paths] == ["fused_stack", "cuda_graph", "eager"]
    assert runner.path_for(runner.step_batch(batch)).name == "cuda_graph"  # 3 rows > 2
    runner.use_paths(fused=cast(FusedQ4Decode, StackSize(max_rows=3)), graphs=graphs)
    assert runner.path_for(runner.step_batch(batch)).name == "fused_stack"
    runner.use_paths(fused=None, graphs=None)
    assert runner.path_for(runner.step_batch(batch)).name == "eager"
    # The tokens do not depend on the path: the graphs' static-buffer step on the CPU.
    runner.use_paths(fused=None, graphs=graphs)
    via_graphs = runner.run(batch)
    runner.use_paths(fused=None, graphs=None)
    assert runner.run(batch).tokens == via_graphs.tokens
