"""Measure what engine steps of known shapes cost, once at start, before serving.

Admission estimates a request's wait in engine steps (server/queue_wait.py), and a burst
arrives before the engine has run any step worth measuring; the first steps it would run are a
small batch's, which on a CPU cost a fraction of a full batch's. So the engine runs, on random
token ids, a prefill chunk of a whole step's token budget and a batch of short prompts (up to
256: a default full batch) through a few decode steps (each twice: the first pass pays one-time
costs, page faults, lazy kernels), and reports the second pass's (tokens, rows, seconds) with
its Ready message (on SmolLM2, 2 cores: 2.7 s of start-up). Then it forgets them: their
prefix-cache entries and counters are cleared, so the metrics start from zero.

`startup_samples` is what the engine process calls: by default it reuses a measurement stored
for the same model, configuration and machine (engine/core/calibration_cache.py), and then only
warms the engine up with one full prefill chunk (the first pass's one-time costs, ~0.3 s).
"""

from __future__ import annotations

import logging
import random
import time

from surge.engine.client.outputs import EngineCoreRequest
from surge.engine.client.step_cost import StepSample
from surge.engine.config import CALIBRATION_MODES
from surge.engine.core import calibration_cache
from surge.engine.core.engine_core import EngineCore
from surge.sampling_params import SamplingParams

log = logging.getLogger(__name__)

MAX_ROWS = 256  # decode rows measured (a default full batch); beyond, the model extrapolates


def startup_samples(engine: EngineCore, mode: str = "cached") -> tuple[StepSample, ...]:
    """The start-up step costs for the Ready message. cached: a stored measurement for this
    model, configuration and machine if there is one (the engine then only warms up), else
    measure and store; measure: always measure (and store); off: none (admission's estimate
    then learns from the first steps alone)."""
    if mode not in CALIBRATION_MODES:
        raise ValueError(f"calibration mode {mode!r}: one of {', '.join(CALIBRATION_MODES)}")
    if mode == "off":
        return ()
    key = calibration_cache.cache_key(engine)
    if mode == "cached":
        stored = calibration_cache.load(key)
        if stored is not None:
            started = time.perf_counter()
            warm_up(engine)
            log.info(
                "step costs from the last start here (warmed up in %.2f s)",
                time.perf_counter() - started,
            )
            return stored
    samples = calibrate(engine)
    if samples:
        calibration_cache.save(key, samples)
    return samples


def warm_up(engine: EngineCore) -> None:
    """One prefill chunk of the whole token budget and a decode step: the one-time costs
    (buffers sized, pages touched, lazy kernel set-up) paid before the first request; then
    forgotten as the calibration is."""
    ids = _ids(random.Random(1), engine.files.spec.vocab_size, _chunk_len(engine))
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.add_request(EngineCoreRequest("warm-up", ids, params))
    while engine.has_work():
        engine.step()
    engine.reset_after_calibration()


def _chunk_len(engine: EngineCore) -> int:
    """A prefill chunk of the whole step budget, as the model and the free KV pool allow."""
    free_tokens = engine.blocks.num_free_blocks * engine.plan.block_size
    budget = engine.scheduler.config.max_num_batched_tokens
    return max(1, min(budget, engine.max_model_len - 2, free_tokens // 2))


def calibrate(engine: EngineCore) -> tuple[StepSample, ...]:
    started = time.perf_counter()
    sched = engine.scheduler.config
    block = engine.plan.block_size
    free_tokens = engine.blocks.num_free_blocks * block
    vocab = engine.files.spec.vocab_size
    rng = random.Random(0)
    long_len = _chunk_len(engine)
    short_len = min(2, long_len)  # the batch's prompts in as few prefill steps as can be
    rows = max(1, min(sched.max_num_seqs, MAX_ROWS, free_tokens // (2 * (short_len + 4) + block)))
    samples: list[StepSample] = []
    for rep in range(2):
        # Distinct ids each pass, so the second pass's prefill is not a prefix-cache hit.
        batches = [[_ids(rng, vocab, long_len)], [_ids(rng, vocab, short_len) for _ in range(rows)]]
        for b, prompts in enumerate(batches):
            max_tokens = 1 if b == 0 else 4
            for i, ids in enumerate(prompts):
                params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
                engine.add_request(EngineCoreRequest(f"calibrate-{rep}-{b}-{i}", ids, params))
            while engine.has_work():
                engine.step()
        drained = engine.stats().steps.samples
        if rep == 1:
            samples = drained
    engine.reset_after_calibration()
    log.info(
        "step costs measured in %.2f s: %s",
        time.perf_counter() - started,
        ", ".join(f"{t} tokens/{r} rows {s * 1e3:.1f} ms" for t, r, s in samples),
    )
    return tuple(samples)


def _ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]
