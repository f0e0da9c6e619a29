"""What the autoscaler reads from each replica's /metrics, and the fleet-wide signals from it.

Gauges are summed over replicas; counters (requests received, latency sums) become rates from
one scrape to the next per replica, so a replica that comes or goes never shows as a jump.

Batch work (the Batch API, docs/batch.md) shows in four series, from the replicas and from the
gateway (which runs fleet-wide batches): `surge:batch_lines{state=pending|in_flight|completed|
failed}`, `surge:batch_tokens_total`, `surge:batch_window_seconds_left` (the nearest deadline of
the active batches; 0 or absent: none) and `surge:batch_lines_per_second` (recent completions).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from surge.observability.scan import scan_metrics

# metric name -> ReplicaLoad field
_METRICS = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "surge:requests_received_total": "received",
    "vllm:e2e_request_latency_seconds_sum": "latency_sum",
    "vllm:e2e_request_latency_seconds_count": "latency_count",
}


BATCH_LINES = "surge:batch_lines"  # gauge, label state
BATCH_TOKENS = "surge:batch_tokens_total"  # counter
BATCH_WINDOW_LEFT = "surge:batch_window_seconds_left"  # gauge
BATCH_LINES_PER_S = "surge:batch_lines_per_second"  # gauge


@dataclass(frozen=True, slots=True)
class BatchLoad:
    """One server's (or the gateway's) batch work, as its /metrics shows it."""

    pending: float = 0.0  # lines not started
    in_flight: float = 0.0  # lines in an engine (running or queued there)
    completed: float = 0.0
    failed: float = 0.0
    tokens: float = 0.0  # counter
    window_left_s: float = 0.0  # the nearest deadline of its active batches; 0: none
    lines_per_s: float = 0.0  # recent completions


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    url: str
    ok: bool  # the scrape answered 200
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    received: float = 0.0  # counter
    latency_sum: float = 0.0  # counter: seconds of finished requests
    latency_count: float = 0.0  # counter: finished requests
    batch: BatchLoad = BatchLoad()


def parse_batch(text: str) -> BatchLoad:
    """The batch series, label-aware (scan_metrics keys on names alone): lines by state summed
    over series, the nearest deadline the smallest positive window."""
    lines = {"pending": 0.0, "in_flight": 0.0, "completed": 0.0, "failed": 0.0}
    tokens = rate = 0.0
    window = float("inf")
    for line in text.splitlines():
        if not line.startswith("surge:batch_"):
            continue
        brace = line.find("{")
        name = line[:brace] if brace > 0 else line.split(" ", 1)[0]
        labels = line[brace : line.rfind("}") + 1] if brace > 0 else ""
        try:
            value = float(line[len(name) + len(labels) :].split()[0])
        except (IndexError, ValueError):
            continue
        if name == BATCH_LINES:
            state = labels.partition('state="')[2].partition('"')[0]
            if state in lines:
                lines[state] += value
        elif name == BATCH_TOKENS:
            tokens += value
        elif name == BATCH_LINES_PER_S:
            rate += value
        elif name == BATCH_WINDOW_LEFT and value > 0:
            window = min(window, value)
    return BatchLoad(
        **lines,
        tokens=tokens,
        lines_per_s=rate,
        window_left_s=0.0 if window == float("inf") else window,
    )


def parse_metrics(url: str, text: str) -> ReplicaLoad:
    found = scan_metrics(text, _METRICS, keep_max=("kv_usage",))
    return ReplicaLoad(url, True, **found, batch=parse_batch(text))


async def scrape(client: httpx.AsyncClient, url: str, timeout_s: float) -> ReplicaLoad:
    try:
        r = await client.get(url + "/metrics", timeout=timeout_s)
    except httpx.HTTPError:
        return ReplicaLoad(url, False)
    return parse_metrics(url, r.text) if r.status_code == 200 else ReplicaLoad(url, False)


async def scrape_all(
    client: httpx.AsyncClient, urls: Sequence[str], timeout_s: float
) -> list[ReplicaLoad]:
    return list(await asyncio.gather(*(scrape(client, u, timeout_s) for u in urls)))


@dataclass(frozen=True, slots=True)
class BatchSignals:
    """The fleet's batch work: every replica's and the gateway's, added up."""

    pending: float = 0.0
    in_flight: float = 0.0  # lines in engines, counted in their running and waiting gauges
    window_left_s: float = 0.0  # the nearest deadline of any active batch; 0: none
    lines_per_s: float = 0.0  # completions, all sources
    tokens_per_s: float | None = None  # from the tokens counter; None: no rate yet
    # Of the waiting gauges, lines (an engine preempts its lines for interactive requests, so
    # where a replica has requests waiting, its lines in flight are among them): per replica
    # min(waiting, its lines in flight).
    waiting: float = 0.0

    @property
    def remaining(self) -> float:
        return self.pending + self.in_flight


@dataclass(frozen=True, slots=True)
class Signals:
    replicas: int  # ready replicas that answered the scrape
    waiting: float  # requests waiting, all replicas (batch lines in their engines included)
    running: float
    kv_usage: float  # mean over replicas
    arrival_rps: float | None  # requests received per second, all replicas; None: no rate yet
    mean_latency_s: float | None  # of requests finished lately; None: none finished yet
    batch: BatchSignals = BatchSignals()

    @property
    def ongoing(self) -> float:
        """Interactive requests running or waiting: the batch lines in the engines (counted in
        their running and waiting gauges) left out, so batch work alone never reads as load."""
        return max(0.0, self.waiting + self.running - self.batch.in_flight)

    @property
    def interactive_waiting(self) -> float:
        return max(0.0, self.waiting - self.batch.waiting)


class SignalTracker:
    """Turns scrapes into Signals, keeping each replica's previous counters for its rates."""

    def __init__(self) -> None:
        self._previous: dict[str, tuple[float, ReplicaLoad]] = {}
        self._latency_s: float | None = None
        self._batch_tokens: dict[str, tuple[float, float]] = {}  # source -> (time, counter)

    def update(
        self, now_s: float, loads: Sequence[ReplicaLoad], gateway: ReplicaLoad | None = None
    ) -> Signals:
        """`gateway`: the gateway's scrape, for its batches alone (its other series are its own)."""
        ok = [x for x in loads if x.ok]
        rate: float | None = None
        latency_sum = latency_count = 0.0
        for load in ok:
            before = self._previous.get(load.url)
            if before is None:
                continue
            then_s, old = before
            dt = now_s - then_s
            received = load.received - old.received
            if dt <= 0 or received < 0:  # a restarted replica's counters begin again
                continue
            rate = (rate or 0.0) + received / dt
            latency_sum += max(0.0, load.latency_sum - old.latency_sum)
            latency_count += max(0.0, load.latency_count - old.latency_count)
        if latency_count > 0:
            self._latency_s = latency_sum / latency_count
        self._previous = {x.url: (now_s, x) for x in ok}
        sources = ok + ([gateway] if gateway is not None and gateway.ok else [])
        batch = self._batch(now_s, sources, gateway)
        if rate is not None:
            # Batch lines reach admission as requests do (surge:requests_received_total counts
            # them), about as fast as they complete: the forecast is of interactive arrivals.
            rate = max(0.0, rate - batch.lines_per_s)
        return Signals(
            replicas=len(ok),
            waiting=sum(x.waiting for x in ok),
            running=sum(x.running for x in ok),
            kv_usage=sum(x.kv_usage for x in ok) / len(ok) if ok else 0.0,
            arrival_rps=rate,
            mean_latency_s=self._latency_s,
            batch=batch,
        )

    def _batch(
        self, now_s: float, sources: Sequence[ReplicaLoad], gateway: ReplicaLoad | None
    ) -> BatchSignals:
        windows = [x.batch.window_left_s for x in sources if x.batch.window_left_s > 0]
        tokens_rate: float | None = None
        for x in sources:
            before = self._batch_tokens.get(x.url)
            if before is not None and now_s > before[0] and x.batch.tokens >= before[1]:
                tokens_rate = (tokens_rate or 0.0) + (x.batch.tokens - before[1]) / (
                    now_s - before[0]
                )
        self._batch_tokens = {x.url: (now_s, x.batch.tokens) for x in sources}
        return BatchSignals(
            pending=sum(x.batch.pending for x in sources),
            in_flight=sum(x.batch.in_flight for x in sources),
            window_left_s=min(windows, default=0.0),
            lines_per_s=sum(x.batch.lines_per_s for x in sources),
            tokens_per_s=tokens_rate,
            waiting=sum(min(x.waiting, x.batch.in_flight) for x in sources if x is not gateway),
        )
