"""Per-request discrete-event simulation of a fleet behind the gateway.

Each arrival goes to the ready replica with the fewest requests (the gateway's least
outstanding); a replica runs up to max_num_seqs at once and queues the rest in order. A request
that starts at concurrency c (itself included) gets the profile's TTFT(c) after its wait, then
TPOT(c) per further token: its latency is fixed when it starts (the engine's batch changes
under it; the profile's means at each level absorb that). It meets the SLO when its wait plus
TTFT(c) and its TPOT(c) meet the targets. A replica asked for is ready cold_start later; a
drained one leaves the rotation at once and finishes what it holds.

Batch lines (surge/fleetsim/batch.py) run at the lowest priority: a ready replica with no
interactive request waiting takes lines while its sequences number fewer than run.batch_fill
(the target concurrency, which meets the SLO); an interactive request that finds its replica at
max_num_seqs preempts a line, which goes back to the queue and runs again from the start (the
engine's recompute preemption), as do the lines of a drained replica. The gateway balances
interactive requests on the interactive load, since lines yield. A line at concurrency c takes
TTFT(c) + (tokens - 1) TPOT(c), and counts in c for every request that starts beside it.

Every interval_s the policy's Controller (the real desired_replicas and Stabilizer) gets the
ready replicas' running and waiting counts, the arrivals per second since the last tick and the
mean latency of the requests started since (known at their start here; the autoscaler reads
that of those finished from /metrics), as the autoscaler sees them.
"""

from __future__ import annotations

import heapq
import operator
from collections import deque

import numpy as np

from surge.autoscale.controller import pick_victims
from surge.autoscale.providers.base import Replica, ReplicaState
from surge.autoscale.signals import Signals
from surge.fleetsim.batch import BatchQueue, Job, line_seconds
from surge.fleetsim.control import Controller
from surge.fleetsim.profile import CapacityProfile
from surge.fleetsim.result import PolicyResult, RunConfig

_by_load = operator.attrgetter("load")


class _Line:
    __slots__ = ("alive", "job")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.alive = True  # False: preempted or handed back; its finish event is void


class _Rep:
    __slots__ = ("draining", "lines", "load", "queue", "replica", "running")

    def __init__(self, n: int, now_s: float) -> None:
        self.replica = Replica(str(n), f"sim://{n}", ReplicaState.READY, now_s)
        self.running = 0  # sequences in the engine, batch lines included
        self.queue: deque[float] = deque()
        self.draining = False
        self.load = 0  # interactive running + queued: what the gateway balances on
        self.lines: list[_Line] = []  # batch lines running here


def simulate_requests(
    times: np.ndarray,
    profile: CapacityProfile,
    controller: Controller,
    run: RunConfig,
    initial: int,
    batch: BatchQueue | None = None,
) -> PolicyResult:
    cfg = controller.autoscaler
    out = PolicyResult(controller.name)
    n_out = max(0.0, profile.output_tokens - 1)
    slo_ttft = run.slo_ttft_s if run.slo_ttft_s is not None else float("inf")
    slo_tpot = run.slo_tpot_s if run.slo_tpot_s is not None else float("inf")
    ttft_of = {c: profile.ttft(c) for c in range(1, run.max_num_seqs + 1)}
    tpot_of = {c: profile.tpot(c) for c in range(1, run.max_num_seqs + 1)}
    serial = 0
    ready: list[_Rep] = []
    draining: list[_Rep] = []
    for _ in range(max(1, initial)):
        ready.append(_Rep(serial, 0.0))
        serial += 1
    starting: list[float] = []  # ready times, sorted
    finishes: list[tuple[float, int, _Rep, _Line | None]] = []  # (time, seq, replica, line)
    seq = 0
    fill = min(run.batch_fill, run.max_num_seqs)
    held: deque[float] = deque()  # arrivals with no ready replica (the gateway holds them)
    since_arrivals = 0
    latencies: list[float] = []  # of requests started since the last tick
    mean_latency: float | None = None

    def begin(rep: _Rep, now: float, arrived: float) -> None:
        nonlocal seq
        rep.running += 1
        c = rep.running
        ttft, tpot = ttft_of[c], tpot_of[c]
        if arrived < run.duration_s:
            out.judged += 1
            out.met += (now - arrived + ttft) <= slo_ttft and tpot <= slo_tpot
        heapq.heappush(finishes, (now + ttft + n_out * tpot, seq, rep, None))
        seq += 1
        latencies.append(now - arrived + ttft + n_out * tpot)

    def fill_lines(rep: _Rep, now: float) -> None:
        """Batch lines into what the replica's interactive requests leave."""
        nonlocal seq
        if batch is None or rep.queue or now >= run.duration_s:
            return
        while rep.running < fill and batch.pending >= 1 - 1e-9:
            ((job, _),) = batch.take(1.0)
            line = _Line(job)
            rep.lines.append(line)
            rep.running += 1
            c = rep.running
            took = line_seconds(ttft_of[c], tpot_of[c], job.tokens)
            heapq.heappush(finishes, (now + took, seq, rep, line))
            seq += 1

    def hand_back(rep: _Rep, n: int) -> None:
        assert batch is not None
        for line in rep.lines[-n:]:  # the newest: the least work lost
            line.alive = False
            batch.give_back(line.job, 1.0)
        del rep.lines[-n:]
        rep.running -= n

    def admit(now: float, arrived: float) -> None:
        if not ready:
            held.append(arrived)
            return
        rep = min(ready, key=_by_load)
        rep.load += 1
        if rep.running >= run.max_num_seqs and rep.lines:
            hand_back(rep, 1)  # preempted for an interactive request
        if rep.running < run.max_num_seqs:
            begin(rep, now, arrived)
        else:
            rep.queue.append(arrived)

    def finish(now: float, rep: _Rep, line: _Line | None) -> None:
        rep.running -= 1
        if line is not None:
            rep.lines.remove(line)
            assert batch is not None
            batch.finish(line.job, 1.0, now)
        else:
            rep.load -= 1
            if rep.queue:
                begin(rep, now, rep.queue.popleft())
        if not rep.draining:
            fill_lines(rep, now)

    def fill_all(now: float) -> None:
        for rep in sorted(ready, key=_by_load):  # the least loaded first, as the gateway
            fill_lines(rep, now)

    def promote(now: float) -> None:
        nonlocal serial
        while starting and starting[0] <= now:
            ready.append(_Rep(serial, starting.pop(0)))
            serial += 1
            controller.stabilizer.note(now, len(ready))
            while held:
                admit(now, held.popleft())
            fill_lines(ready[-1], now)

    inf = float("inf")
    i, n = 0, len(times)
    tick = 0.0
    last_tick = 0.0
    while True:
        next_arrival = float(times[i]) if i < n else inf
        next_finish = finishes[0][0] if finishes else inf
        next_ready = starting[0] if starting else inf
        # No decisions past the span: what is left just finishes.
        now = min(next_arrival, next_finish, next_ready, tick if tick < run.duration_s else inf)
        if now == inf:
            break
        if now == next_finish:
            _, _, rep, line = heapq.heappop(finishes)
            if line is None or line.alive:
                finish(now, rep, line)
        elif now == next_ready:
            promote(now)
        elif now == next_arrival:
            i += 1
            since_arrivals += 1
            admit(now, now)
        else:  # a decision
            dt = now - last_tick
            if latencies:
                mean_latency = sum(latencies) / len(latencies)
                latencies.clear()
            draining[:] = [r for r in draining if r.load]
            out.replica_s += dt * (len(ready) + len(starting) + len(draining))
            if batch is not None and batch.submit_due(now):
                fill_all(now)
            signals = Signals(
                replicas=len(ready),
                waiting=float(sum(len(r.queue) for r in ready) + len(held)),
                running=float(sum(r.running for r in ready)),
                kv_usage=0.0,  # the profile has no KV figure: this signal is not modelled
                arrival_rps=since_arrivals / dt if dt > 0 else None,
                mean_latency_s=mean_latency,
                **({} if batch is None else {"batch": batch.signals(now)}),
            )
            current = len(ready) + len(starting)
            target, _ = controller.decide(now, signals, current)
            out.timeline.add(
                now,
                since_arrivals / dt if dt > 0 else 0.0,
                len(ready),
                len(starting),
                controller.last_forecast,
            )
            if target != current:
                out.scale_events += 1
            if target > current:
                starting.extend([now + profile.start_s] * (target - current))
                starting.sort()
            elif target < current and not starting:
                load = {r.replica.url: float(r.load) for r in ready}
                keep = min(1, cfg.min_replicas)
                victims = pick_victims([r.replica for r in ready], load, current - target, keep)
                gone = {v.url for v in victims}
                leaving = [r for r in ready if r.replica.url in gone]
                for r in leaving:
                    r.draining = True
                    if r.lines:  # its lines run again elsewhere
                        hand_back(r, len(r.lines))
                draining += leaving
                ready[:] = [r for r in ready if r.replica.url not in gone]
                if batch is not None and batch.pending >= 1:
                    fill_all(now)
            since_arrivals = 0
            last_tick = now
            tick = now + cfg.interval_s
    if batch is not None:
        out.batch = batch.summary()
    return out
