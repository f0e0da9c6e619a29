"""What limits a replica now: pure rules over a sliding window of engine and process samples.

A `Sample` is plain numbers read once a second (gauges, and counters since start); a window's
`Evidence` is what changed across it; `diagnose` names the bottleneck by the first rule that
holds, in this order (docs/observability-diagnosis.md states each with its threshold):

    admission    users are refused: 429s (queue cap, rate limits) over a share of arrivals
    kv_memory    the KV pool is what stops work: preemptions, or admissions blocked on blocks
    api_process  the HTTP process's CPU is saturated while the engine waits for work
    prefill      busy steps full of prefill chunks while requests queue for a first token
    compute      busy steps full (token budget or max_num_seqs) while requests queue
    idle         nothing ran and nothing waited
    healthy      none of these
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

KINDS = ("compute", "kv_memory", "prefill", "admission", "api_process", "idle", "healthy")

ACTIONS = {
    "compute": "add replicas, or a faster precision (int8/q4 weights, a GPU)",
    "kv_memory": "give the KV cache more memory (--kv-cache-memory-gib), a smaller KV dtype "
    "(--kv-cache-dtype int8), or lower --max-num-seqs",
    "prefill": "raise the token budget (--max-num-batched-tokens), use prefix caching, or "
    "route long prompts to a prefill-heavy replica",
    "admission": "raise --max-queued-requests or the rate limits if the engine has room; "
    "else add replicas",
    "api_process": "give the HTTP process a core of its own (more CPUs, --api-niceness), "
    "or put more replicas behind a gateway",
    "idle": "nothing to do; scale down if it stays idle",
    "healthy": "nothing to do",
}


@dataclass(frozen=True, slots=True)
class DiagnosisConfig:
    window_s: float = 10.0  # the rules look at this much history
    min_span_s: float = 2.0  # a shorter window (just started) says only idle or healthy
    busy_ratio: float = 0.85  # engine busy: this share of wall time spent in step()
    gpu_busy_percent: float = 85.0  # or NVML's utilization this high
    full_step_ratio: float = 0.9  # a full step: mean tokens over the budget, or running/max
    waiting_min: float = 0.5  # a queue: at least this many requests waiting on average
    kv_blocked_share: float = 0.1  # admissions blocked on KV blocks in this share of steps
    kv_full_ratio: float = 0.95  # or KV usage this high on average with a queue
    rejected_share: float = 0.02  # 429s over this share of arrivals
    prefill_share: float = 0.5  # prefill chunks this share of the scheduled tokens
    api_cpu_percent: float = 85.0  # the HTTP process's CPU (100 = one core)
    api_engine_busy_max: float = 0.5  # ... while the engine is busy at most this share

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.min_span_s < 0 or self.min_span_s > self.window_s:
            raise ValueError("diagnosis: need 0 <= min_span_s <= window_s and window_s > 0")


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading: gauges now, counters since the process started."""

    t_s: float
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    steps: int = 0
    step_tokens: int = 0
    prefill_tokens: int = 0
    preemptions: int = 0
    blocked_on_kv: int = 0
    step_time_s: float = 0.0  # the engine's wall time in step()
    wait_time_s: float = 0.0  # ... and blocked waiting for work
    received: int = 0  # requests that reached admission
    rejected: int = 0  # ... and were refused (429/503)
    api_cpu_s: float | None = None  # CPU seconds (user + system) of the HTTP process
    engine_cpu_s: float | None = None
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    gpu_utilization_percent: float | None = None  # mean over GPUs (NVML); None: no GPU seen
    gpu_memory_ratio: float | None = None  # the fullest GPU's memory, 0..1


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a window shows; rates and shares over its span, None where nothing measures it."""

    span_s: float = 0.0
    running_mean: float = 0.0
    waiting_mean: float = 0.0
    waiting_growth: float = 0.0  # last minus first
    kv_usage_mean: float = 0.0
    kv_usage_max: float = 0.0
    preemptions: int = 0
    blocked_on_kv: int = 0
    steps: int = 0
    step_tokens_mean: float = 0.0
    budget_fill: float = 0.0  # mean step tokens over the token budget
    seq_fill: float = 0.0  # mean running over max_num_seqs
    prefill_share: float = 0.0  # prefill tokens over all scheduled tokens
    engine_busy: float = 0.0  # step time over step + wait time
    engine_cpu_percent: float | None = None
    api_cpu_percent: float | None = None
    received: int = 0
    rejected: int = 0
    rejected_share: float = 0.0
    gpu_utilization_percent: float | None = None
    gpu_memory_ratio: float | None = None

    def figures(self) -> dict[str, float]:
        """The numeric figures (None left out), for gauges and JSON."""
        return {k: float(v) for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: str
    reason: str
    evidence: Evidence

    @property
    def action(self) -> str:
        return ACTIONS[self.kind]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _cpu_percent(first: float | None, last: float | None, span_s: float) -> float | None:
    if first is None or last is None or span_s <= 0:
        return None
    return max(0.0, last - first) / span_s * 100.0


def evidence(samples: list[Sample]) -> Evidence:
    """The figures of a window of samples, oldest first."""
    if not samples:
        return Evidence()
    a, b = samples[0], samples[-1]
    span = max(0.0, b.t_s - a.t_s)
    steps = max(0, b.steps - a.steps)
    tokens = max(0, b.step_tokens - a.step_tokens)
    step_time = max(0.0, b.step_time_s - a.step_time_s)
    wait_time = max(0.0, b.wait_time_s - a.wait_time_s)
    received = max(0, b.received - a.received)
    rejected = max(0, b.rejected - a.rejected)
    running = _mean([s.num_running for s in samples])
    step_mean = tokens / steps if steps else 0.0
    gpu_utils = [
        s.gpu_utilization_percent for s in samples if s.gpu_utilization_percent is not None
    ]
    gpu_mems = [s.gpu_memory_ratio for s in samples if s.gpu_memory_ratio is not None]
    return Evidence(
        span_s=span,
        running_mean=running,
        waiting_mean=_mean([s.num_waiting for s in samples]),
        waiting_growth=float(b.num_waiting - a.num_waiting),
        kv_usage_mean=_mean([s.kv_usage for s in samples]),
        kv_usage_max=max(s.kv_usage for s in samples),
        preemptions=max(0, b.preemptions - a.preemptions),
        blocked_on_kv=max(0, b.blocked_on_kv - a.blocked_on_kv),
        steps=steps,
        step_tokens_mean=step_mean,
        budget_fill=step_mean / b.max_num_batched_tokens if b.max_num_batched_tokens else 0.0,
        seq_fill=running / b.max_num_seqs if b.max_num_seqs else 0.0,
        prefill_share=max(0, b.prefill_tokens - a.prefill_tokens) / tokens if tokens else 0.0,
        engine_busy=step_time / (step_time + wait_time) if step_time + wait_time > 0 else 0.0,
        engine_cpu_percent=_cpu_percent(a.engine_cpu_s, b.engine_cpu_s, span),
        api_cpu_percent=_cpu_percent(a.api_cpu_s, b.api_cpu_s, span),
        received=received,
        rejected=rejected,
        rejected_share=rejected / received if received else 0.0,
        gpu_utilization_percent=_mean(gpu_utils) if gpu_utils else None,
        gpu_memory_ratio=max(gpu_mems) if gpu_mems else None,
    )


def diagnose(samples: list[Sample], config: DiagnosisConfig) -> Verdict:
    """The bottleneck of a window of samples (oldest first): the first rule that holds."""
    e = evidence(samples)
    c = config
    quiet = e.steps == 0 and e.running_mean == 0 and e.waiting_mean == 0 and e.rejected == 0
    if e.span_s < c.min_span_s:
        if quiet:
            return Verdict("idle", "no work in the window", e)
        return Verdict("healthy", f"window of {e.span_s:.1f}s too short to judge", e)
    if e.rejected > 0 and e.rejected_share >= c.rejected_share:
        return Verdict(
            "admission",
            f"{e.rejected} of {e.received} requests refused ({e.rejected_share:.0%}) at the door",
            e,
        )
    blocked_share = e.blocked_on_kv / e.steps if e.steps else 0.0
    queued = e.waiting_mean >= c.waiting_min
    if e.preemptions > 0 or (e.blocked_on_kv > 0 and blocked_share >= c.kv_blocked_share):
        return Verdict(
            "kv_memory",
            f"{e.preemptions} preemptions, admissions blocked on KV "
            f"blocks in {blocked_share:.0%} of steps, KV usage up to "
            f"{e.kv_usage_max:.0%}",
            e,
        )
    if queued and e.kv_usage_mean >= c.kv_full_ratio:
        return Verdict(
            "kv_memory", f"KV usage {e.kv_usage_mean:.0%} with {e.waiting_mean:.1f} waiting", e
        )
    api = e.api_cpu_percent
    api_hot = api is not None and api >= c.api_cpu_percent
    if api_hot and e.engine_busy <= c.api_engine_busy_max and e.received > 0:
        return Verdict(
            "api_process",
            f"HTTP process at {api:.0f}% CPU while the engine "
            f"is busy {e.engine_busy:.0%} of the time",
            e,
        )
    gpu = e.gpu_utilization_percent
    busy = e.engine_busy >= c.busy_ratio or (gpu is not None and gpu >= c.gpu_busy_percent)
    full = e.budget_fill >= c.full_step_ratio or e.seq_fill >= c.full_step_ratio
    queueing = queued or e.waiting_growth > 0
    if (
        busy
        and queueing
        and e.prefill_share >= c.prefill_share
        and e.budget_fill >= c.full_step_ratio
    ):
        return Verdict(
            "prefill",
            f"{e.prefill_share:.0%} of step tokens are prefill chunks, "
            f"steps {e.budget_fill:.0%} of the budget, {e.waiting_mean:.1f} "
            "waiting for a first token",
            e,
        )
    if busy and queueing and full:
        return Verdict(
            "compute",
            f"engine busy {e.engine_busy:.0%}, steps "
            f"{max(e.budget_fill, e.seq_fill):.0%} full, {e.waiting_mean:.1f} "
            "waiting",
            e,
        )
    if quiet:
        return Verdict("idle", "no work in the window", e)
    return Verdict("healthy", "no limit reached", e)


class Diagnoser:
    """Keeps the window and the current verdict; `update` says when the kind changed."""

    def __init__(self, config: DiagnosisConfig | None = None) -> None:
        self.config = config if config is not None else DiagnosisConfig()
        self._samples: deque[Sample] = deque()
        self.current = Verdict("idle", "no samples yet", Evidence())
        self.since_s: float | None = None  # when the current kind began

    def update(self, sample: Sample, now_s: float) -> bool:
        """Add a sample, drop those older than the window, re-judge; True if the kind changed."""
        self._samples.append(sample)
        while self._samples and self._samples[0].t_s < now_s - self.config.window_s:
            self._samples.popleft()
        verdict = diagnose(list(self._samples), self.config)
        changed = verdict.kind != self.current.kind
        if changed or self.since_s is None:
            self.since_s = now_s
        self.current = verdict
        return changed
