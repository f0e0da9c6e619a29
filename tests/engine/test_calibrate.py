"""The engine's start-up measurement of step costs, on the tiny model in process."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from surge import SamplingParams
from surge.engine.client.step_cost import StepCostModel
from surge.engine.core import calibration_cache
from surge.engine.core.calibrate import (
    MAX_ROWS,
    PROBE_SHARE,
    calibrate,
    startup,
    warm_up,
)
from surge.engine.llm import LLM


def test_calibration_measures_half_a_prefill_chunk_and_decode_rows_then_forgets_them(
    tiny_model_dir: Path,
) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", max_num_batched_tokens=128, max_num_seqs=32)
    engine = llm.engine
    before = llm.generate(["a b c d"], SamplingParams(max_tokens=6, temperature=0.0))
    engine.reset_after_calibration()  # the warm-up request above must not count either
    samples = calibrate(engine)
    shapes = {(tokens, rows) for tokens, rows, _ in samples}
    assert (128 // PROBE_SHARE, 1) in shapes  # a prefill chunk of half the budget, one sequence
    rows = min(32, MAX_ROWS) // PROBE_SHARE
    assert (rows, rows) in shapes  # decode steps of half a full batch of short prompts
    assert len(samples) == 4  # the long prefill, the batch's prefill, two decode steps
    assert all(seconds > 0 for _, _, seconds in samples)
    assert StepCostModel(samples).ready  # enough distinct shapes to fit the three terms
    # Forgotten: nothing running or cached, every counter back at zero.
    stats = engine.stats()
    assert not engine.has_work() and engine.blocks.usage() == 0.0
    assert stats.prefix_cache_blocks == 0 and stats.prefix_cache.queries == 0
    assert (
        stats.steps.num_steps == 0
        and stats.steps.prompt_tokens == stats.steps.generation_tokens == 0
    )
    assert stats.steps.samples == [] and stats.scheduler.tenant_tokens == {}
    # The engine serves as before, token for token.
    after = llm.generate(["a b c d"], SamplingParams(max_tokens=6, temperature=0.0))
    assert after[0].outputs[0].token_ids == before[0].outputs[0].token_ids


def test_a_stored_measurement_is_reused_on_the_same_model_configuration_and_machine(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cached: the first start measures and stores; the next start with the same model and
    configuration reuses the stored samples (the seconds of a new measurement would differ)
    and only warms up, leaving nothing behind; measure refreshes the store; another
    configuration has its own; off measures nothing."""
    monkeypatch.setenv("SURGE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    llm = LLM(str(tiny_model_dir), dtype="float32", max_num_batched_tokens=64, max_num_seqs=8)
    engine = llm.engine
    first = startup(engine, "cached")[0]
    assert first and len(list((tmp_path / "calibration").glob("*.json"))) == 1
    again = startup(engine, "cached")[0]
    assert again == first  # the stored floats, not a new measurement
    stats = engine.stats()
    assert not engine.has_work() and stats.steps.num_steps == 0 and stats.steps.prompt_tokens == 0
    measured = startup(engine, "measure")[0]
    assert measured != first and startup(engine, "cached")[0] == measured
    other = LLM(str(tiny_model_dir), dtype="float32", max_num_batched_tokens=64, max_num_seqs=4)
    assert calibration_cache.cache_key(other.engine) != calibration_cache.cache_key(engine)
    assert startup(other.engine, "cached")[0] != measured
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 2
    assert startup(engine, "off")[0] == ()
    with pytest.raises(ValueError, match="calibration mode"):
        startup(engine, "sometimes")[0]


def test_an_unwritable_store_only_means_measuring_each_time(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SURGE_CALIBRATION_DIR", str(blocker / "calibration"))
    llm = LLM(str(tiny_model_dir), dtype="float32", max_num_batched_tokens=64, max_num_seqs=8)
    with caplog.at_level(logging.WARNING):
        first = startup(llm.engine, "cached")[0]
    assert first and "not kept for the next start" in caplog.text
    assert startup(llm.engine, "cached")[0] != first  # measured again


def test_a_stored_measurement_leaves_the_warm_up_for_after_ready(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The engine process sends Ready before warming up where the costs were stored: startup
    says the warm-up is owed (and ran none), a fresh measurement owes none; the warm-up then
    leaves nothing behind and the engine serves as before."""
    monkeypatch.setenv("SURGE_CALIBRATION_DIR", str(tmp_path / "calibration"))
    llm = LLM(str(tiny_model_dir), dtype="float32", max_num_batched_tokens=64, max_num_seqs=8)
    engine = llm.engine
    params = SamplingParams(max_tokens=6, temperature=0.0)
    before = llm.generate(["a b c d"], params)
    engine.reset_after_calibration()
    measured, owed = startup(engine, "cached", warm_now=False)
    assert measured and not owed  # it measured: warmed up on the way
    with caplog.at_level(logging.INFO, logger="surge.engine.core.calibrate"):
        stored, owed = startup(engine, "cached", warm_now=False)
    assert stored == measured and owed
    assert "warm-up after ready" in caplog.text and "warmed up in" not in caplog.text
    warm_up(engine)
    stats = engine.stats()
    assert not engine.has_work() and stats.steps.num_steps == 0 and engine.blocks.usage() == 0.0
    after = llm.generate(["a b c d"], params)
    assert after[0].outputs[0].token_ids == before[0].outputs[0].token_ids
