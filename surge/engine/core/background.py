"""Background work: requests that more urgent work outranks by the priority policies' preemption
rule (Policy.should_preempt), such as Batch API lines behind interactive requests.

Preemption alone frees a slot and blocks only when the batch is full; a background row that
keeps its slot still makes every step longer, and on a CPU a step's time grows with every row.
An interactive request then waits twice: for the step in flight, then for its own prefill step,
both lengthened by the background rows. So, each step:

1. Hold: while a request waits for its first token, the running and waiting requests it could
   preempt sit the step out (they keep their blocks and slots, and resume in the next step):
   its prefill runs in a step as short as it would be without them.
2. Slice: while more urgent work is present (or was, within `background_quiet_s`), background
   rows may lengthen a step by at most `background_step_ms`, priced by a step-cost model fitted
   to the engine's own steps (engine/client/step_cost.py), and at least one row a step gets
   room, so the batch always moves. A request that arrives mid-step then waits for a step
   hardly longer than the urgent work's own. On a GPU, where a row costs little, the bound
   lets nearly everything through.
   The slice shrinks as urgent rows grow past BUSY_ROWS (slice x BUSY_ROWS / rows): at a peak
   every millisecond added to a step also lengthens each urgent request's decode, so more of
   them run at once and the next arrival's prefill step (which carries all their decode rows)
   grows with them; a fixed slice compounded into the tail. With nothing more urgent present
   (a valley, within the quiet time) the slice is IDLE_SLICES times larger: an arrival then
   meets an engine that would otherwise be idle, and a bg-only step pays the step's fixed
   cost for few rows.

With nothing more urgent seen for `background_quiet_s` (work that ran alone before it came
counts too), background work is no longer background: it runs whole steps, as the same requests
sent directly would (a batch alone is not slowed).
Requests of equal priority, and the fcfs and fair policies, never meet either rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from surge.engine.client.step_cost import StepCostModel, StepSample
from surge.engine.config import SchedulerConfig
from surge.engine.core.policies import Policy
from surge.engine.core.request import Request

BUSY_ROWS = 4  # urgent rows that leave the whole slice to background rows; more shrink it
IDLE_SLICES = 4.0  # the slice with nothing more urgent present, in slices


@dataclass(slots=True)
class StepPlan:
    """Which requests sit this step out, which share a bounded slice of it, and what is left."""

    held: set[str] = field(default_factory=set)
    sliced: set[str] = field(default_factory=set)
    left_s: float | None = None  # seconds background rows may still add; None: no bound
    per_token_s: float = 0.0
    per_row_s: float = 0.0
    num_rows: int = 0  # background rows given room this step

    def bounded(self, req: Request) -> bool:
        return self.left_s is not None and req.req_id in self.sliced

    def allow(self, req: Request, want: int) -> int:
        """How many of the `want` tokens `req` may compute this step (0: none)."""
        if req.req_id in self.held:
            return 0
        if not self.bounded(req) or want <= 0:
            return want
        assert self.left_s is not None
        room = self.left_s - self.per_row_s
        fits = want if self.per_token_s <= 0 else int(room // self.per_token_s)
        if room < 0:
            fits = 0
        if self.num_rows == 0:
            fits = max(fits, 1)  # one background row a step always moves
        return max(0, min(want, fits))

    def charge(self, req: Request, num_tokens: int) -> None:
        if self.bounded(req) and self.left_s is not None:
            self.left_s -= self.per_row_s + self.per_token_s * num_tokens
            self.num_rows += 1


class Background:
    """The scheduler's background rules (module docstring); plans each step."""

    def __init__(self, config: SchedulerConfig, policy: Policy) -> None:
        self.policy = policy
        self.step_s = None if config.background_step_ms is None else config.background_step_ms / 1e3
        self.quiet_s = config.background_quiet_s
        self.step_cost = StepCostModel()
        self._lead: tuple[Request, float] | None = None  # the last urgent request, and when
        self._seen: tuple[Request, float] | None = None  # the last of a one-class step, and when

    def calibrate(self, samples: Sequence[StepSample]) -> None:
        """The engine's start-up step costs, as the cost model's prior."""
        if self.step_s is not None:
            self.step_cost = StepCostModel(samples)

    def observe(self, num_tokens: int, num_rows: int, seconds: float) -> None:
        """A step the engine ran (its shape and time). Only while the rules are in play: a
        single class of traffic pays no refits in its steps (the calibration stays the prior)."""
        if self.step_s is not None and self._lead is not None:
            self.step_cost.observe(((num_tokens, num_rows, seconds),))

    def plan(
        self, running: Iterable[Request], waiting: Iterable[Request], now_s: float
    ) -> StepPlan:
        present = [*running, *waiting]
        if not present:
            return StepPlan()
        key, preempts = self.policy.key, self.policy.should_preempt
        if self._lead is None:
            # A batch that starts just after interactive work left (alone in the engine, or
            # beside others of its class) is background from its first step: the next arrival
            # would otherwise meet a whole step of it, a prefill-heavy one as its lines start.
            seen = self._seen
            if seen is not None and (
                now_s - seen[1] > self.quiet_s or not preempts(seen[0], present[0], now_s)
            ):
                seen = None
            if seen is not None:
                self._lead, self._seen = seen, None
            elif all(r.priority == present[0].priority for r in present):
                self._seen = present[0], now_s  # remembered, should lower work come next
                return StepPlan()  # one class, as most traffic: nothing to rank
        lead = min(present, key=lambda r: key(r, now_s))
        sliced = {r.req_id for r in present if preempts(lead, r, now_s)}
        if sliced:
            self._lead = lead, now_s
        elif self._lead is not None and now_s - self._lead[1] <= self.quiet_s:
            # The urgent work just left: more of it is likely, and would meet a long step.
            sliced = {r.req_id for r in present if preempts(self._lead[0], r, now_s)}
        else:
            self._lead = None  # quiet long enough: background work is just work again
        if not sliced:
            return StepPlan()
        held: set[str] = set()
        first_token = [r for r in present if r.num_output_tokens == 0]
        if first_token:
            newcomer = min(first_token, key=lambda r: key(r, now_s))
            held = {r.req_id for r in present if preempts(newcomer, r, now_s)}
        plan = StepPlan(held, sliced)
        coef = self.step_cost.coef
        if self.step_s is not None and coef is not None:
            urgent = len(present) - len(sliced)  # the rows the step is for
            if urgent == 0:
                left = self.step_s * IDLE_SLICES
            else:
                left = self.step_s * min(1.0, BUSY_ROWS / urgent)
            plan.left_s, plan.per_token_s, plan.per_row_s = left, coef[1], coef[2]
        return plan
