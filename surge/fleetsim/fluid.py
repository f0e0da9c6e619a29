"""Fluid (rate-based) simulation: the fleet as counts, for rates no per-request simulation can
follow (10,000 req/s on 2,000 replicas: a day is 864 million requests).

Every step of step_s the step's arrivals join a fleet-wide FIFO queue (the gateway balances
perfectly); the ready replicas hold up to max_num_seqs each in service. The step's arrivals
take queue positions p0..p0+A behind the ones already waiting; the one at position p waits p /
(finish rate) seconds, so those within rate x (TTFT target - TTFT(c)) of the front meet the TTFT
target (all of them miss when TPOT(c) is over its target). Fractions of requests are counted.

Time in steps, without the step's grain: a request of service time S admitted during a step
(arrivals spread evenly over it) is, at the step boundaries after, still in service for a
fraction clamp(S/step + 1 - j, 0, 1) at the j-th, so each step's admissions leave over the two
boundaries S/step + 1 and + 2 apart in those shares; and c, the concurrency they start at, is
the mean over the step (those leaving at its end counted half, the step's own admissions for
the share of the step they spend in service). Rounding S to whole steps instead (at least one)
held a 0.43 s request for 1 s: at 1 s steps every replica's capacity read up to 2.3x too low at
low concurrency, and a day of the public-scale sinusoid met the SLO for 0.70 of requests where
0.1 s steps (and the per-request mode, where both run) gave 0.99.

The same Controller (the autoscaler's decide.py and a forecaster) decides every interval_s, on
the same signals the per-request mode gives it. A drained replica takes its share of the
requests in service with it (it finishes them out of the rotation, as in the per-request mode)
and hands its share of batch lines back. Batch lines (surge/fleetsim/batch.py) fill the slots
up to run.batch_fill per replica (the mean over the step, as c) while no interactive request
waits, and yield when interactive requests need the slots: the newest go back to the queue
(the least work lost, as an engine chooses), to run again from the start.
"""

from __future__ import annotations

import numpy as np

from surge.autoscale.signals import Signals
from surge.fleetsim.batch import BatchQueue, Job, line_seconds
from surge.fleetsim.control import Controller
from surge.fleetsim.profile import CapacityProfile
from surge.fleetsim.result import PolicyResult, RunConfig


def _occupancy(s: float) -> float:
    """The mean share of its admission step a request of s steps' service spends in service
    (its arrival even over the step)."""
    return s - s * s / 2 if s < 1 else 0.5


class _Lines:
    """Batch lines in service, per job, by the step they leave at (mod ring)."""

    def __init__(self, ring: int) -> None:
        self.ring = ring
        self.leaving: dict[int, np.ndarray] = {}  # id(job) -> lines leaving k steps on
        self.jobs: dict[int, Job] = {}
        self.total = 0.0

    def add(self, job: Job, n: float, k: int, s: float) -> None:
        if id(job) not in self.leaving:
            self.leaving[id(job)] = np.zeros(self.ring)
            self.jobs[id(job)] = job
        m, r = int(s), s - int(s)
        ring = self.leaving[id(job)]
        ring[(k + m + 1) % self.ring] += n * (1 - r)
        ring[(k + m + 2) % self.ring] += n * r
        self.total += n

    def depart(self, k: int, now_s: float, batch: BatchQueue) -> None:
        for key, ring in list(self.leaving.items()):
            n = ring[k % self.ring]
            if n > 0:
                ring[k % self.ring] = 0.0
                self.total -= n
                batch.finish(self.jobs[key], n, now_s)
            if self.jobs[key].finished:
                self.total -= float(ring.sum())
                del self.leaving[key], self.jobs[key]
        self.total = max(0.0, self.total)

    def preempt(self, n: float, k: int, batch: BatchQueue) -> None:
        """The n newest lines (those leaving last) go back to the queue: an engine preempts
        the sequences with the least work done first."""
        newest_first = (k + np.arange(self.ring - 1, 0, -1)) % self.ring
        for key, ring in self.leaving.items():  # job by job, each its newest first
            if n <= 1e-12:
                break
            held = ring[newest_first]
            before = np.concatenate(([0.0], np.cumsum(held)[:-1]))  # newer than each slot
            back = np.clip(n - before, 0.0, held)
            ring[newest_first] = held - back
            taken = float(back.sum())
            batch.give_back(self.jobs[key], taken)
            self.total -= taken
            n -= taken
        self.total = max(0.0, self.total)

    def hand_back(self, share: float, batch: BatchQueue) -> None:
        """A share of every line in service goes back to the queue (a drained replica's)."""
        for key, ring in self.leaving.items():
            back = ring * share
            ring -= back
            batch.give_back(self.jobs[key], float(back.sum()))
        self.total *= 1 - share


def simulate_fluid(
    counts: np.ndarray,
    step_s: float,
    profile: CapacityProfile,
    controller: Controller,
    run: RunConfig,
    initial: int,
    batch: BatchQueue | None = None,
) -> PolicyResult:
    cfg = controller.autoscaler
    out = PolicyResult(controller.name)
    slo_ttft = run.slo_ttft_s if run.slo_ttft_s is not None else float("inf")
    slo_tpot = run.slo_tpot_s if run.slo_tpot_s is not None else float("inf")
    seqs = run.max_num_seqs
    fill = min(run.batch_fill, seqs)
    ready = max(1, initial)
    starting: list[float] = []
    in_service = waiting = 0.0
    ring = int(profile.e2e(seqs) / step_s) + 3
    leaving = np.zeros(ring)  # requests finishing k steps on, by k mod ring
    longest = max((j.tokens for j in batch.jobs), default=1.0) if batch else 1.0
    lines = _Lines(int(line_seconds(profile.ttft(seqs), profile.tpot(seqs), longest) / step_s) + 3)
    since = 0.0  # arrivals since the last decision
    latency = None
    next_tick = 0.0
    last_tick = 0.0
    s_last = 1.0  # the last step's service time, in steps
    for k, arrivals in enumerate(counts):
        now = k * step_s
        in_service -= leaving[k % ring]  # those whose time is up
        leaving[k % ring] = 0.0
        if batch is not None:
            lines.depart(k, now, batch)
        if starting and starting[0] <= now:
            n = sum(1 for s in starting if s <= now)
            del starting[:n]
            ready += n
            controller.stabilizer.note(now, ready)
        if now >= next_tick and now < run.duration_s:
            dt = now - last_tick
            out.replica_s += dt * (ready + len(starting))
            extra = {}
            if batch is not None:
                batch.submit_due(now)
                extra["batch"] = batch.signals(now)
            signals = Signals(
                ready,
                waiting,
                in_service + lines.total,
                0.0,
                since / dt if dt > 0 else None,
                latency,
                **extra,
            )
            current = ready + len(starting)
            target, _ = controller.decide(now, signals, current)
            out.timeline.add(
                now, since / dt if dt > 0 else 0.0, ready, len(starting), controller.last_forecast
            )
            if target != current:
                out.scale_events += 1
            if target > current:
                starting.extend([now + profile.start_s] * (target - current))
            elif target < current and not starting:
                keep = max(min(1, cfg.min_replicas), ready - (current - target))
                # A drained replica finishes what it runs, out of the rotation (and the signals).
                in_service *= keep / ready
                leaving *= keep / ready
                if batch is not None:
                    lines.hand_back(1 - keep / ready, batch)
                ready = keep
            since, last_tick, next_tick = 0.0, now, now + cfg.interval_s
        slots = ready * seqs
        ahead = in_service + waiting - slots  # queue positions before this step's arrivals
        admitted = max(0.0, min(waiting + arrivals, slots - in_service))
        waiting += arrivals - admitted
        # The mean in service over the step: those leaving at its end half of it.
        mean = in_service - leaving[(k + 1) % ring] / 2 + admitted * _occupancy(s_last)
        in_service += admitted
        if batch is not None:
            over = mean + lines.total - slots
            if over > 1e-9:  # interactive requests take the slots of batch lines
                lines.preempt(over, k, batch)
        if batch is not None and waiting <= 1e-6 and batch.pending > 0 and now < run.duration_s:
            room = ready * fill - mean - lines.total
            if room > 1e-9:
                c_line = max((mean + lines.total + room) / ready, 1.0)
                ttft_line, tpot_line = profile.ttft(c_line), profile.tpot(c_line)
                for job, count in batch.take(room):
                    took = line_seconds(ttft_line, tpot_line, job.tokens)
                    lines.add(job, count, k, took / step_s)
        c = max((mean + lines.total) / ready, 1.0)
        e2e = profile.e2e(c)
        s_last = e2e / step_s
        m, r = int(s_last), s_last - int(s_last)
        leaving[(k + m + 1) % ring] += admitted * (1 - r)
        leaving[(k + m + 2) % ring] += admitted * r
        rate = in_service / e2e  # requests finished per second, about
        if now < run.duration_s and arrivals > 0:
            out.judged += arrivals
            ttft, tpot = profile.ttft(c), profile.tpot(c)
            if tpot <= slo_tpot and ttft <= slo_ttft:
                # Positions up to rate x slack wait no longer than the slack allows.
                reach = rate * (slo_ttft - ttft) if slo_ttft != float("inf") else float("inf")
                out.met += min(max(reach - ahead, 0.0), float(arrivals))
        since += arrivals
        latency = e2e + (waiting / rate if rate > 0 else 0.0)
    if batch is not None:
        out.batch = batch.summary()
    return out
