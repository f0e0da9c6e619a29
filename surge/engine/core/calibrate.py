"""Measure what engine steps of known shapes cost, once at start, before serving.

Admission estimates a request's wait in engine steps (server/queue_wait.py), and a burst
arrives before the engine has run any step worth measuring; the first steps it would run are a
small batch's, which on a CPU cost a fraction of a full batch's. So the engine warms up (a short
prompt: the one-time costs, lazy kernels and first buffers, paid outside the measurement), then
runs, on random token ids, a prefill chunk of half a step's token budget and a batch of short
prompts (half a default full batch, up to 128) through two decode steps, and reports those
steps' (tokens, rows, seconds) with its Ready message. A step's cost is linear in its tokens and
rows (engine/client/step_cost.py), so half-size probes fit the same three terms for a quarter
of the time of the full-size pair of passes this ran before (a 1B on 2 cores: 58.6 s of its
first start). Then it forgets them: their prefix-cache entries and counters are cleared, so the
metrics start from zero.

`startup` is what the engine process calls: by default it reuses a measurement stored for the
same model, configuration and machine (engine/core/calibration_cache.py), and then only warms
the engine up with a short prompt, after its Ready message (a request that comes meanwhile waits
for it: what it would have paid itself) (WARM_UP_TOKENS: a full prefill chunk, as it once was,
cost a 1B's start 7.4 s, and a first full chunk after the short one measured no slower than the
next).
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

MAX_ROWS = 256  # a default full batch; the probes take half of it, the model extrapolates
PROBE_SHARE = 2  # the probes' share of the step budget and of a full batch: one half
WARM_UP_TOKENS = 16


def startup(
    engine: EngineCore, mode: str = "cached", warm_now: bool = True
) -> tuple[tuple[StepSample, ...], bool]:
    """The engine's start-up step costs, and whether a warm-up is still owed. mode cached: the
    measurement stored for the same model, configuration and machine if there is one (the
    engine then only warms up: at once, or with `warm_now` False after Ready, by the caller,
    where nothing watches the warm-up's blocks), else measure and store; measure: always
    measure (and store); off: none (admission's estimate then learns from the first steps
    alone)."""
    if mode not in CALIBRATION_MODES:
        raise ValueError(f"calibration mode {mode!r}: one of {', '.join(CALIBRATION_MODES)}")
    if mode == "off":
        return (), False
    key = calibration_cache.cache_key(engine)
    if mode == "cached":
        stored = calibration_cache.load(key)
        if stored is not None:
            if not warm_now:
                log.info("step costs from the last start here (warm-up after ready)")
                return stored, True
            started = time.perf_counter()
            warm_up(engine)
            log.info(
                "step costs from the last start here (warmed up in %.2f s)",
                time.perf_counter() - started,
            )
            return stored, False
    samples = calibrate(engine)
    if samples:
        calibration_cache.save(key, samples)
    return samples, False


def warm_up(engine: EngineCore) -> None:
    """A short prompt and a decode step: the one-time costs (lazy kernel set-up, first buffers)
    paid before the first request; then forgotten as the calibration is."""
    length = min(WARM_UP_TOKENS, _chunk_len(engine))
    ids = _ids(random.Random(1), engine.files.spec.vocab_size, length)
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
    warm_up(engine)
    sched = engine.scheduler.config
    block = engine.plan.block_size
    free_tokens = engine.blocks.num_free_blocks * block
    vocab = engine.files.spec.vocab_size
    rng = random.Random(0)
    long_len = max(1, _chunk_len(engine) // PROBE_SHARE)
    short_len = min(2, long_len)  # the batch's prompts in as few prefill steps as can be
    batch = max(1, min(sched.max_num_seqs, MAX_ROWS) // PROBE_SHARE)
    rows = max(1, min(batch, free_tokens // (2 * (short_len + 3) + block)))
    # The long prompt's one prefill step, then the batch's prefill and two decode steps.
    for b, prompts in enumerate(
        [[_ids(rng, vocab, long_len)], [_ids(rng, vocab, short_len) for _ in range(rows)]]
    ):
        max_tokens = 1 if b == 0 else 3
        for i, ids in enumerate(prompts):
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            engine.add_request(EngineCoreRequest(f"calibrate-{b}-{i}", ids, params))
        while engine.has_work():
            engine.step()
    samples = engine.stats().steps.samples
    engine.reset_after_calibration()
    log.info(
        "step costs measured in %.2f s: %s",
        time.perf_counter() - started,
        ", ".join(f"{t} tokens/{r} rows {s * 1e3:.1f} ms" for t, r, s in samples),
    )
    return tuple(samples)


def _ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]
