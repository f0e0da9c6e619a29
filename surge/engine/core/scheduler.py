"""Continuous batching under one token budget per step, with chunked prefill and preemption.

Each step: running requests first (decodes and unfinished prefill chunks, in policy order), then
waiting requests join while budget, sequence slots and KV blocks last. When blocks run out, the
running request the policy ranks last is preempted by recompute: its blocks are freed and it goes
back to waiting with all its tokens (prompt + output so far), to be prefilled again later.
Before that, if the request the policy would admit next cannot fit (no sequence slot or blocks),
the policy may let it displace the running request it ranks last (priority preemption). The
work it could displace also stays out of its way when nothing is full: it sits out the steps of a
more urgent request's prefill, and takes a bounded slice of each step while more urgent work
runs (engine/core/background.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from surge.engine.client.outputs import FinishReason, TokenLogprob
from surge.engine.config import SchedulerConfig, SpeculativeConfig
from surge.engine.core.background import Background, StepPlan
from surge.engine.core.batch import SampledTokens, ScheduledRequest, SchedulerOutput
from surge.engine.core.block_manager import BlockManager
from surge.engine.core.ngram import NgramIndex
from surge.engine.core.policies import Policy
from surge.engine.core.request import Request, RequestStatus
from surge.engine.sample.sampling_row import SamplingRow
from surge.engine.stats import SchedulerStats, SpecStats

MAX_TRACKED_TENANTS = 1000
OTHER_TENANT = "other"


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        blocks: BlockManager,
        policy: Policy,
        speculative: SpeculativeConfig | None = None,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.config = config
        self.blocks = blocks
        self.policy = policy
        self.background = Background(config, policy)  # lower classes behind urgent work
        self.speculative = speculative if speculative is not None else SpeculativeConfig()
        self.eos_token_ids = eos_token_ids  # a draft's accepted tokens stop at one
        self.stats = SchedulerStats()  # its counters, since start
        self.spec_stats = SpecStats()
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._seq = itertools.count()

    # ---- lifecycle -------------------------------------------------------------------------
    def add(self, req: Request) -> None:
        if req.req_id in self.requests:
            raise ValueError(f"duplicate request id {req.req_id!r}")
        req.seq_no = next(self._seq)
        self.requests[req.req_id] = req
        self.waiting.append(req)
        self.policy.on_add(req)

    def finish(self, req_id: str, reason: FinishReason) -> Request | None:
        """End a request wherever it is (abort, stop) and free its blocks. Unknown id: None."""
        req = self.requests.pop(req_id, None)
        if req is None:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self._free_blocks(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        self.policy.on_finish(req)
        return req

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step --------------------------------------------------------------------------
    def schedule(self, now_s: float) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        key = self.policy.key
        scheduled: list[tuple[Request, int]] = []
        drafts: dict[str, list[int]] = {}  # the drafts verified this step
        preempted = self._make_room(now_s, budget)
        self.running.sort(key=lambda r: key(r, now_s))
        num_made_room = len(preempted)
        plan = self.background.plan(self.running, self.waiting, now_s)

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = plan.allow(req, min(req.num_tokens - req.num_computed_tokens, budget))
            if num_new == 0:  # background: held, or its slice of the step is spent
                i += 1
                continue
            decode = req.num_tokens - req.num_computed_tokens == 1
            draft = req.draft[: budget - 1] if decode and not plan.bounded(req) else []
            while True:
                total = req.num_computed_tokens + num_new + len(draft)
                if self.blocks.allocate_slots(req.req_id, total) is not None:
                    break
                if draft:  # no room for the draft: decode without it before preempting
                    draft = []
                    continue
                victim = self.running[-1]  # ranked last by the policy, not yet scheduled
                self._preempt(victim)
                preempted.append(victim.req_id)
                if victim is req:
                    break
            if req.status is RequestStatus.WAITING:
                break  # req itself was preempted: everything after it is gone too
            if draft:
                drafts[req.req_id] = draft
            plan.charge(req, num_new)
            scheduled.append((req, num_new + len(draft)))
            budget -= num_new + len(draft)
            i += 1

        # After preempting for blocks, admitting new work in the same step would only thrash.
        if len(preempted) == num_made_room:
            budget = self._admit(now_s, budget, scheduled, plan)

        for req, num_new in scheduled:
            self.policy.on_scheduled(req, num_new)
            self._count_tokens(req.tenant, num_new)
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now_s
        out = tuple(self._describe(req, n, drafts.get(req.req_id, ())) for req, n in scheduled)
        return SchedulerOutput(
            out, sum(n for _, n in scheduled), tuple(preempted), tuple(self.blocks.take_copies())
        )

    def _admit(
        self, now_s: float, budget: int, scheduled: list[tuple[Request, int]], plan: StepPlan
    ) -> int:
        key = self.policy.key
        self.waiting.sort(key=lambda r: key(r, now_s))
        admitted: list[Request] = []
        for req in self.waiting:
            if budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if self._waits_for_sibling(req):
                continue  # let the sibling fill the shared prompt blocks first
            if plan.allow(req, 1) == 0:
                break  # background (ranked after the rest): held, or its slice is spent
            self._fork_from_sibling(req)
            # A request scoring its prompt computes every position: it takes no cached blocks
            # (it would rewrite blocks that others read).
            reuse = not self.blocks.has(req.req_id) and not req.wants_prompt_logprobs
            if reuse:
                req.num_computed_tokens = self.blocks.lookup_prefix(
                    req.all_token_ids, req.block_hashes
                )
            num_new = plan.allow(req, min(req.num_tokens - req.num_computed_tokens, budget))
            got = self.blocks.allocate_slots(
                req.req_id,
                req.num_computed_tokens + num_new,
                req.all_token_ids if reuse else (),
                req.block_hashes if reuse else (),
            )
            if got is None:
                self.stats.num_blocked_on_kv += 1
                break  # head-of-line: don't let later arrivals jump a request that doesn't fit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = req.num_computed_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            admitted.append(req)
            plan.charge(req, num_new)
            scheduled.append((req, num_new))
            budget -= num_new
        if admitted:
            done = set(map(id, admitted))
            self.waiting = [r for r in self.waiting if id(r) not in done]
        return budget

    def _make_room(self, now_s: float, budget: int) -> list[str]:
        """Preempt running work ranked below the next waiting request when that one cannot fit."""
        if not self.waiting or not self.running:
            return []
        key = self.policy.key
        newcomer = min(self.waiting, key=lambda r: key(r, now_s))
        preempted: list[str] = []
        while self.running:
            victim = max(self.running, key=lambda r: key(r, now_s))
            if not self.policy.should_preempt(newcomer, victim, now_s):
                break
            if self._fits(newcomer, budget):
                break
            self._preempt(victim)
            preempted.append(victim.req_id)
        return preempted

    def _fits(self, req: Request, budget: int) -> bool:
        if len(self.running) >= self.config.max_num_seqs:
            return False
        cached = self.blocks.lookup_prefix(req.all_token_ids, req.block_hashes)
        num_tokens = min(req.num_tokens, cached + budget)
        # Conservative: a cached block may sit in the free queue, so count it as needed too.
        return -(-num_tokens // self.blocks.block_size) <= self.blocks.num_free_blocks

    def _count_tokens(self, tenant: str, num_tokens: int) -> None:
        # Bounded: past the cap, new tenants share one entry (as the metrics' label cap does).
        counted = self.stats.tenant_tokens
        if tenant not in counted and len(counted) >= MAX_TRACKED_TENANTS:
            tenant = OTHER_TENANT
        counted[tenant] = counted.get(tenant, 0) + num_tokens

    def _waits_for_sibling(self, req: Request) -> bool:
        sibling = self.requests.get(req.share_prompt_with or "")
        if sibling is None or self.blocks.has(req.req_id):
            return False
        return sibling.num_computed_tokens < sibling.num_prompt_tokens

    def _fork_from_sibling(self, req: Request) -> None:
        """Without the prefix cache, n > 1 siblings share the prompt's full blocks by fork."""
        sibling = self.requests.get(req.share_prompt_with or "")
        if sibling is None or self.blocks.enable_prefix_caching or self.blocks.has(req.req_id):
            return
        if req.wants_prompt_logprobs:
            return
        if not self.blocks.has(sibling.req_id):
            return
        # Keep at least one prompt token to compute: its logits give the first sample.
        num_blocks = (req.num_prompt_tokens - 1) // self.blocks.block_size
        if num_blocks == 0:
            return
        self.blocks.fork(sibling.req_id, req.req_id, num_blocks)
        req.num_computed_tokens = num_blocks * self.blocks.block_size

    def _preempt(self, req: Request) -> None:
        req.draft = []
        self.running.remove(req)
        self._free_blocks(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.append(req)
        self.stats.num_preemptions += 1

    def _free_blocks(self, req: Request) -> None:
        # With its tokens, so that the computed start of its last block stays reusable.
        self.blocks.free(req.req_id, req.all_token_ids, req.block_hashes, req.num_computed_tokens)

    def _describe(self, req: Request, num_new: int, draft: Sequence[int]) -> ScheduledRequest:
        """num_new: the step's tokens, draft included (its last len(draft))."""
        start = req.num_computed_tokens
        end = start + num_new - len(draft)
        sampling = None
        draft_rows: tuple[SamplingRow, ...] = ()
        if end == req.num_tokens:
            sampling = SamplingRow(
                req.params,
                req.seed,
                req.prompt_token_ids,
                req.output_token_ids,
                req.grammar,
                req.bad_words,
            )
            # After draft token i the request would have generated these: the same seed
            # stream, penalties and min_tokens as a plain decode of them.
            draft_rows = tuple(
                SamplingRow(
                    req.params,
                    req.seed,
                    req.prompt_token_ids,
                    [*req.output_token_ids, *draft[: i + 1]],
                    bad_words=req.bad_words,
                )
                for i in range(len(draft))
            )
        # Prompt logprobs: position p's logits score prompt token p + 1, for the positions of
        # this chunk not scored yet (a recompute after preemption scores nothing twice).
        first = max(start, len(req.prompt_logprobs)) if req.wants_prompt_logprobs else end
        last = min(end, req.num_prompt_tokens - 1)
        targets = tuple(req.prompt_token_ids[first + 1 : last + 1]) if first < last else ()
        return ScheduledRequest(
            req_id=req.req_id,
            prompt_rows_start=first - start if targets else 0,
            prompt_targets=targets,
            prompt_top=req.params.prompt_logprobs or 0,
            token_ids=tuple(req.all_token_ids[start:end]) + tuple(draft),
            start_pos=start,
            block_table=tuple(self.blocks.block_table(req.req_id)),
            sampling=sampling,
            lora_slot=req.lora_slot,
            draft=tuple(draft),
            draft_sampling=draft_rows,
            batch_invariant=req.params.batch_invariant,
            num_prompt_tokens=req.num_prompt_tokens,
        )

    # ---- after the model ran ---------------------------------------------------------------
    def update(self, batch: SchedulerOutput, sampled: SampledTokens) -> list[Request]:
        """Advance every scheduled request; return those that got new tokens (one, or with a
        draft, the accepted draft tokens and the one sampled after them: req.num_new_tokens)."""
        advanced: list[Request] = []
        for sreq in batch.requests:
            req = self.requests.get(sreq.req_id)
            if req is None:
                continue  # aborted while the step ran
            tok = sampled.tokens.get(sreq.req_id)
            draft = sreq.draft
            # Sampled at each position: a draft token is accepted while it is what was sampled
            # there (for a draft without probabilities of its own, exactly speculative
            # sampling's acceptance rule); the first sample that differs, or the one after the
            # whole draft, is the step's last new token.
            new = [] if tok is None else [tok, *sampled.drafts.get(sreq.req_id, ())]
            accepted = 0
            while accepted < len(draft) and new[accepted].token_id == draft[accepted]:
                accepted += 1
            if draft:
                self.spec_stats.num_drafts += 1
                self.spec_stats.draft_tokens += len(draft)
                self.spec_stats.accepted_tokens += accepted
            req.prompt_logprobs += sampled.prompt_logprobs.get(sreq.req_id, ())
            computed = sreq.start_pos + len(sreq.token_ids) - len(draft) + accepted
            req.num_new_tokens = 0
            for t in new[: accepted + 1]:
                logprob = None
                if t.logprob is not None:
                    logprob = TokenLogprob(t.logprob, t.top_logprobs or ())
                req.append_token(t.token_id, logprob)
                req.num_new_tokens += 1
                if req.stop_reason(self.eos_token_ids) is not None:
                    break  # the engine ends it; accepted tokens past a stop are dropped
            # (Less when a stop cut the accepted tokens short: the request ends now anyway.)
            req.num_computed_tokens = min(computed, req.num_tokens - 1) if new else computed
            self.blocks.cache_full_blocks(
                req.req_id,
                req.all_token_ids,
                req.block_hashes,
                req.num_computed_tokens,
                req.lora_slot if req.lora_slot >= 0 else None,  # the KV events' lora_id
            )
            if req.num_new_tokens:
                advanced.append(req)
                req.draft = self._propose(req)
        return advanced

    def _propose(self, req: Request) -> list[int]:
        """The draft to verify at the request's next decode (prompt lookup), or []."""
        spec = self.speculative
        if not spec.enabled or req.grammar is not None:
            return []
        limit = spec.disable_by_batch_size
        if limit is not None and len(self.running) > limit:
            return []
        # Leave room for the token sampled after the draft: never past max_tokens.
        k = min(spec.num_speculative_tokens, req.max_tokens - req.num_output_tokens - 1)
        if k <= 0:
            return []
        if req.ngram is None:
            req.ngram = NgramIndex(spec.prompt_lookup_min, spec.prompt_lookup_max)
        proposal: list[int] = req.ngram.propose(req.all_token_ids, k)
        return proposal

    # ---- observability ---------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)
