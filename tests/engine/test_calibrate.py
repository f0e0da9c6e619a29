"""The engine's start-up measurement of step costs, on the tiny model in process."""

from __future__ import annotations

from pathlib import Path

from surge import SamplingParams
from surge.engine.calibrate import MAX_ROWS, calibrate
from surge.engine.llm import LLM
from surge.engine.step_cost import StepCostModel


def test_calibration_measures_a_full_prefill_chunk_and_decode_rows_then_forgets_them(
    tiny_model_dir: Path,
) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", max_num_batched_tokens=128, max_num_seqs=32)
    engine = llm.engine
    before = llm.generate(["a b c d"], SamplingParams(max_tokens=6, temperature=0.0))
    engine.reset_after_calibration()  # the warm-up request above must not count either
    samples = calibrate(engine)
    shapes = {(tokens, rows) for tokens, rows, _ in samples}
    assert (128, 1) in shapes  # a prefill chunk of the whole budget, one sequence
    rows = min(32, MAX_ROWS)
    assert (rows, rows) in shapes  # decode steps of the whole batch of short prompts
    assert all(seconds > 0 for _, _, seconds in samples)
    assert StepCostModel(samples).ready  # enough distinct shapes to fit the three terms
    # Forgotten: nothing running or cached, every counter back at zero.
    stats = engine.stats()
    assert not engine.has_work() and engine.blocks.usage() == 0.0
    assert stats.prefix_cache_blocks == 0 and stats.prefix_cache_queries == 0
    assert stats.num_steps == 0 and stats.prompt_tokens == stats.generation_tokens == 0
    assert stats.step_samples == [] and stats.tenant_tokens == {}
    # The engine serves as before, token for token.
    after = llm.generate(["a b c d"], SamplingParams(max_tokens=6, temperature=0.0))
    assert after[0].outputs[0].token_ids == before[0].outputs[0].token_ids
