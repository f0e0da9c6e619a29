"""Fluid (rate-based) simulation: the fleet as counts, for rates no per-request simulation can
follow (10,000 req/s on 2,000 replicas: a day is 864 million requests).

Every step of step_s the step's arrivals join a fleet-wide FIFO queue (the gateway balances
perfectly); the ready replicas hold up to max_num_seqs each in service, at concurrency c =
in service / ready; a request admitted at c leaves e2e(c) later. The step's arrivals
take queue positions p0..p0+A behind the ones already waiting; the one at position p waits p /
(finish rate) seconds, so those within rate x (TTFT target - TTFT(c)) of the front meet the TTFT
target (all of them miss when TPOT(c) is over its target). Fractions of requests are counted.

The same Controller (the autoscaler's decide.py and a forecaster) decides every interval_s, on
the same signals the per-request mode gives it. A drained replica takes its share of the
requests in service with it (it finishes them out of the rotation, as in the per-request mode).
"""

from __future__ import annotations

import numpy as np

from surge.autoscale.signals import Signals
from surge.fleetsim.control import Controller
from surge.fleetsim.profile import CapacityProfile
from surge.fleetsim.result import PolicyResult, RunConfig


def simulate_fluid(
    counts: np.ndarray,
    step_s: float,
    profile: CapacityProfile,
    controller: Controller,
    run: RunConfig,
    initial: int,
) -> PolicyResult:
    cfg = controller.autoscaler
    out = PolicyResult(controller.name)
    slo_ttft = run.slo_ttft_s if run.slo_ttft_s is not None else float("inf")
    slo_tpot = run.slo_tpot_s if run.slo_tpot_s is not None else float("inf")
    seqs = run.max_num_seqs
    ready = max(1, initial)
    starting: list[float] = []
    in_service = waiting = 0.0
    ring = round(profile.e2e(seqs) / step_s) + 2
    leaving = np.zeros(ring)  # requests finishing k steps on, by k mod ring
    since = 0.0  # arrivals since the last decision
    latency = None
    next_tick = 0.0
    last_tick = 0.0
    for k, arrivals in enumerate(counts):
        now = k * step_s
        if starting and starting[0] <= now:
            n = sum(1 for s in starting if s <= now)
            del starting[:n]
            ready += n
            controller.stabilizer.note(now, ready)
        if now >= next_tick and now < run.duration_s:
            dt = now - last_tick
            out.replica_s += dt * (ready + len(starting))
            signals = Signals(ready, waiting, in_service, 0.0,
                              since / dt if dt > 0 else None, latency)  # fmt: skip
            current = ready + len(starting)
            target, _ = controller.decide(now, signals, current)
            out.timeline.add(now, since / dt if dt > 0 else 0.0, ready, len(starting),
                             controller.last_forecast)  # fmt: skip
            if target != current:
                out.scale_events += 1
            if target > current:
                starting.extend([now + profile.start_s] * (target - current))
            elif target < current and not starting:
                keep = max(min(1, cfg.min_replicas), ready - (current - target))
                # A drained replica finishes what it runs, out of the rotation (and the signals).
                in_service *= keep / ready
                leaving *= keep / ready
                ready = keep
            since, last_tick, next_tick = 0.0, now, now + cfg.interval_s
        in_service -= leaving[k % ring]  # those whose time is up
        leaving[k % ring] = 0.0
        slots = ready * seqs
        ahead = in_service + waiting - slots  # queue positions before this step's arrivals
        admitted = max(0.0, min(waiting + arrivals, slots - in_service))
        waiting += arrivals - admitted
        in_service += admitted
        c = max(in_service / ready if ready else 0.0, 1.0)
        e2e = profile.e2e(c)
        # Each request keeps the latency of the concurrency it started at (as per request).
        leaving[(k + max(1, round(e2e / step_s))) % ring] += admitted
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
    return out
