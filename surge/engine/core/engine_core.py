"""EngineCore: the synchronous step loop, single-threaded; the server drives it in its own process.

step():  batch = scheduler.schedule(now)  ->  sampled = runner.run(batch)
         advanced = scheduler.update(batch, sampled)  ->  token-level stops  ->  outputs
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import replace

from surge.engine.client.outputs import EngineCoreOutput, EngineCoreRequest, FinishReason
from surge.engine.config import EngineConfig, SchedulerConfig
from surge.engine.core.block_manager import BlockManager
from surge.engine.core.kv_publisher import KVEventPublisher
from surge.engine.core.policies import make_policy
from surge.engine.core.request import Request
from surge.engine.core.scheduler import Scheduler
from surge.engine.runner.config import RunnerConfig
from surge.engine.runner.kv_cache import KVCachePlan
from surge.engine.runner.loader import load_model
from surge.engine.runner.lora_manager import LoRAManager
from surge.engine.runner.model_runner import ModelRunner
from surge.engine.sample.grammar import GrammarCompiler
from surge.engine.sample.sampler import Sampler
from surge.engine.sample.token_rules import encode_bad_words
from surge.engine.stats import EngineStats, StepStats
from surge.models.device import Precision
from surge.models.formats.model_files import ModelFiles, open_model
from surge.models.formats.resolve import resolve_model
from surge.sampling_params import effective_max_tokens

log = logging.getLogger(__name__)

BATCH_INVARIANT_UNAVAILABLE = (
    "batch-invariant mode runs on the fused 4-bit stack (q4 weights on a CPU with its compiled "
    "kernels, AVX-512 VNNI or AVX2); this server runs without it"
)


class EngineCore:
    def __init__(self, config: EngineConfig, files: ModelFiles | None = None) -> None:
        self.config = config
        if files is None:
            files = open_model(resolve_model(config.model.model))
        self.files = files
        self.tokenizer = files.tokenizer
        # Device, dtype, quantization and the KV cache are decided (and logged) in load_model.
        loaded = load_model(config.model, config.cache, files, config.scheduler)
        self.precision: Precision = loaded.precision
        self.plan: KVCachePlan = loaded.plan
        self.model = loaded.model
        # A request must always fit in the pool, or it would wait forever: the context is capped.
        self.max_model_len = loaded.max_model_len
        cache = config.cache
        self.eos_token_ids = tuple(self.tokenizer.eos_token_ids)
        device = loaded.precision.device
        use_kernels = config.model.use_kernels and device.type == "cpu"
        if use_kernels:
            from surge.models.kernels import load_token_mask

            load_token_mask()  # built now, if need be, not at the first structured request
        sampler = Sampler(self.eos_token_ids, seed=config.model.seed, use_kernels=use_kernels)
        self.grammars = GrammarCompiler(self.tokenizer, files.spec.vocab_size, self.eos_token_ids)
        self.runner = ModelRunner(
            model=self.model,
            kv_caches=loaded.kv_caches,
            sampler=sampler,
            device=loaded.precision.device,
            config=RunnerConfig.from_engine(config, self.max_model_len),
            dtype=loaded.precision.dtype,
        )
        self.loras: LoRAManager | None = self.runner.loras  # the adapters' registry
        scheduler_config = self._check_batch_invariant(config)
        if config.model.compile and config.model.compile_warmup:
            log.info("compiled decode graphs ready in %.1f s", self.runner.warm_up())
        self.blocks = BlockManager(
            self.plan.num_blocks, cache.block_size, cache.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            scheduler_config,
            self.blocks,
            make_policy(config.scheduler),
            config.speculative,
            self.eos_token_ids,
        )
        self._rng = random.Random(config.model.seed)
        # Its own counters; the process loop adds the time it blocks waiting for work.
        self.step_stats = StepStats()
        self.kv_events: KVEventPublisher | None = None  # start_kv_events(), once serving

    def _check_batch_invariant(self, config: EngineConfig) -> SchedulerConfig:
        """The scheduler's config: with --batch-invariant, its step budget capped where the
        fused stack ends (a larger step would run layer by layer, with other numerics).
        ValueError where the mode cannot hold (no fused 4-bit stack)."""
        sched = config.scheduler
        if not config.model.batch_invariant:
            return sched
        max_rows = self.runner.capabilities.fused_max_rows
        if max_rows is None:
            raise ValueError(BATCH_INVARIANT_UNAVAILABLE)
        if sched.max_num_batched_tokens > max_rows:
            log.info(
                "batch-invariant: step budget %d tokens (the fused stack's largest step)", max_rows
            )
            sched = replace(sched, max_num_batched_tokens=max_rows)
        log.info("batch-invariant mode: every step on one kernel for 1 and N rows")
        return sched

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, creq: EngineCoreRequest) -> None:
        """Queue a request. Raises ValueError if it can never be served (too long, bad tokens)."""
        prompt_len = len(creq.prompt_token_ids)
        if prompt_len == 0:
            raise ValueError("prompt is empty")
        if prompt_len >= self.max_model_len:
            raise ValueError(
                f"prompt has {prompt_len} tokens; the context length is {self.max_model_len}"
            )
        vocab = self.files.spec.vocab_size
        if any(t < 0 or t >= vocab for t in creq.prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        creq.params.check_vocab(vocab)
        if creq.params.batch_invariant and not self.runner.capabilities.batch_invariant:
            raise ValueError(BATCH_INVARIANT_UNAVAILABLE)
        max_tokens = effective_max_tokens(creq.params.max_tokens, self.max_model_len - prompt_len)
        seed = creq.seed
        if seed is None:
            seed = creq.params.seed if creq.params.seed is not None else self._rng.getrandbits(63)
        cache_salt = (creq.cache_salt or "").encode()
        lora_slot = -1
        if creq.lora_name is not None:
            adapter = self._lora_manager().get(creq.lora_name)
            lora_slot, cache_salt = adapter.slot, cache_salt + adapter.cache_salt
        req = Request(
            creq.req_id,
            list(creq.prompt_token_ids),
            creq.params,
            creq.arrival_s if creq.arrival_s is not None else time.monotonic(),
            seed,
            max_tokens,
            self.plan.block_size,
            priority=creq.priority,
            tenant=creq.tenant,
            cache_salt=cache_salt,
            share_prompt_with=creq.share_prompt_with,
            grammar=(
                self.grammars.matcher(creq.params.structured) if creq.params.structured else None
            ),
            lora_slot=lora_slot,
            bad_words=encode_bad_words(creq.params.bad_words, self.tokenizer),
        )
        self.scheduler.add(req)

    # ---- LoRA adapters -----------------------------------------------------------------------
    def add_lora(self, name: str, path: str) -> None:
        """Load a PEFT adapter under `name`; ValueError says why it cannot be."""
        self._lora_manager().add(name, path)

    def remove_lora(self, name: str) -> None:
        self._lora_manager().remove(name, self._live_lora_slots())

    def _lora_manager(self) -> LoRAManager:
        if self.loras is None:
            raise ValueError("LoRA adapters are not enabled on this server (--enable-lora)")
        return self.loras

    def list_loras(self) -> tuple[tuple[str, str], ...]:
        return self.loras.listing() if self.loras is not None else ()

    def _live_lora_slots(self) -> list[int]:
        return [r.lora_slot for r in self.scheduler.requests.values() if r.lora_slot >= 0]

    def abort(self, req_id: str, reason: FinishReason = FinishReason.ABORT) -> bool:
        """End a request at once and free its blocks. False if it was not (or no longer) here."""
        return self.scheduler.finish(req_id, reason) is not None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def reset_after_calibration(self) -> None:
        """Forget the start-up calibration's requests (engine/core/calibrate.py): their cached
        prefix blocks and every counter they moved, so the metrics start from zero."""
        if self.has_work():
            raise RuntimeError("calibration left requests behind")
        self.blocks.reset_prefix_cache()
        for counters in (self.blocks.stats, self.scheduler.stats, self.scheduler.spec_stats):
            counters.reset()
        self.step_stats.reset()

    # ---- KV events ---------------------------------------------------------------------------
    def start_kv_events(self) -> KVEventPublisher | None:
        """Publish the prefix cache's events from now on (config.kv_events; None when off).
        Called once the start-up calibration is forgotten: the first batch says the cache is
        empty (AllBlocksCleared), which also tells subscribers of a restarted engine to drop
        what they knew of the last one."""
        if not self.config.kv_events.enabled or self.kv_events is not None:
            return self.kv_events
        self.kv_events = KVEventPublisher(self.config.kv_events)
        medium = "GPU" if self.precision.device.type == "cuda" else "CPU"
        self.blocks.enable_events(medium)
        self.blocks.reset_prefix_cache()  # records AllBlocksCleared
        self._publish_kv_events()
        return self.kv_events

    def _publish_kv_events(self) -> None:
        assert self.kv_events is not None
        events = self.blocks.take_events()
        if events:
            self.kv_events.publish(events)

    # ---- the step ----------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        started = time.perf_counter()
        try:
            return self._step(started)
        finally:
            if self.kv_events is not None:  # what the step cached and evicted, one batch
                self._publish_kv_events()
            self.step_stats.step_time_s += time.perf_counter() - started

    def _step(self, started: float) -> list[EngineCoreOutput]:
        if self.loras is not None and self.loras.retiring:
            self.loras.reap(self._live_lora_slots())  # unloaded adapters whose requests ended
        now = time.monotonic()
        batch = self.scheduler.schedule(now)
        if batch.is_empty:
            return []
        sampled = self.runner.run(batch)
        advanced = self.scheduler.update(batch, sampled)
        counted = self.step_stats
        counted.num_steps += 1
        counted.step_tokens += batch.num_tokens
        counted.prefill_tokens += sum(len(s.token_ids) for s in batch.requests if not s.is_decode)
        outputs: list[EngineCoreOutput] = []
        for req in advanced:
            n = req.num_new_tokens  # more than one when a speculative draft was accepted
            counted.generation_tokens += n
            reason = req.stop_reason(self.eos_token_ids)
            if reason is None and req.grammar is not None and _grammar_done(req):
                reason = FinishReason.STOP
            if reason is not None:
                self.scheduler.finish(req.req_id, reason)
            first = req.num_output_tokens == n
            if first:
                counted.prompt_tokens += req.num_prompt_tokens
            outputs.append(
                EngineCoreOutput(
                    req_id=req.req_id,
                    new_token_ids=req.output_token_ids[-n:],
                    new_logprobs=req.logprobs[-n:] if req.params.logprobs is not None else None,
                    finish_reason=reason,
                    num_prompt_tokens=req.num_prompt_tokens,
                    num_cached_tokens=max(req.num_cached_tokens, 0),
                    num_preemptions=req.num_preemptions,
                    queue_time_s=(req.first_scheduled_s or now) - req.arrival_s if first else 0.0,
                    prompt_logprobs=(
                        req.prompt_logprobs
                        if first and req.params.prompt_logprobs is not None
                        else None
                    ),
                )
            )
        elapsed = time.perf_counter() - started
        # The scheduler prices background rows by these (engine/core/background.py).
        self.scheduler.background.observe(batch.num_tokens, len(batch.requests), elapsed)
        if len(counted.samples) < 4096:  # bounded where nobody reads the stats (LLM)
            counted.samples.append((batch.num_tokens, len(batch.requests), elapsed))
        return outputs

    def stats(self) -> EngineStats:
        """Gauges of now, each part's counters (copies), the step samples since the last call."""
        sched = self.scheduler
        lora_names = self.loras.names_by_slot() if self.loras is not None else {}
        return EngineStats(
            num_running=sched.num_running,
            num_waiting=sched.num_waiting,
            kv_cache_usage=self.blocks.usage(),
            num_blocks=self.plan.num_blocks,
            block_size=self.plan.block_size,
            prefix_cache_blocks=self.blocks.num_cached_blocks,
            lora_running=self._adapters_of(sched.running, lora_names),
            lora_waiting=self._adapters_of(sched.waiting, lora_names),
            max_loras=self.loras.config.max_loras if self.loras is not None else 0,
            # The scheduler's own limits: --batch-invariant may have capped the token budget.
            max_num_seqs=sched.config.max_num_seqs,
            max_num_batched_tokens=sched.config.max_num_batched_tokens,
            scheduler=sched.stats.take(),
            spec=sched.spec_stats.take(),
            prefix_cache=self.blocks.stats.take(),
            steps=self.step_stats.take(),
        )

    @staticmethod
    def _adapters_of(reqs: list[Request], names: dict[int, str]) -> tuple[str, ...]:
        if not names:
            return ()
        return tuple(sorted({names[r.lora_slot] for r in reqs if r.lora_slot in names}))


def _grammar_done(req: Request) -> bool:
    """Feed the new token to the request's matcher: True once the grammar is complete (only EOS
    could follow) or the matcher failed, which the mask should make impossible."""
    matcher = req.grammar
    if not matcher.consume_token(req.output_token_ids[-1]):
        log.error("request %s: grammar matcher failed: %s", req.req_id, matcher.get_error())
        return True
    return bool(matcher.is_stopped())
