"""Subscribe to every upstream's KV events and keep the KvIndex (`--policy kv_aware`).

Each scrape interval, every upstream's GET /version says where it publishes (its `kv_events`:
endpoint, replay endpoint, topic, block size, hash scheme); a wildcard host (tcp://*:5557)
means the upstream's own host. One ZMQ SUB socket per upstream feeds the index, batch by
batch. A batch that does not follow the last one asks the replay socket (when there is one)
for what was missed; failing that the index drops the replica (kv_index.py), as it does when
the connection goes away (a restart: the socket's monitor sees it) or the upstream leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import urlsplit

import httpx
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry, Counter, Gauge
from zmq.utils.monitor import parse_monitor_message

from surge.gateway.kv_index import KvIndex
from surge.gateway.kv_tokens import load_tokenizer
from surge.gateway.upstreams import UpstreamPool
from surge.kv_events.hashing import HASH_SCHEME
from surge.kv_events.wire import KVEventBatch, decode_batch, parse_seq, seq_bytes

log = logging.getLogger(__name__)

REPLAY_TIMEOUT_S = 2.0
WILDCARD_HOSTS = ("*", "0.0.0.0", "::", "[::]", "")


class KvMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.blocks = Gauge(
            "surge_gateway_kv_index_blocks",
            "KV blocks an upstream reports holding (its KV events)",
            ["upstream"],
            registry=registry,
        )
        self.batches = Counter(
            "surge_gateway_kv_event_batches",
            "KV event batches applied",
            ["upstream"],
            registry=registry,
        )
        self.drops = Counter(
            "surge_gateway_kv_index_drops",
            "an upstream's index entries dropped (gap, restart, cleared, disconnected)",
            ["upstream", "reason"],
            registry=registry,
        )


def events_endpoint(advertised: str, upstream_url: str) -> str:
    """The advertised ZMQ address, a wildcard host replaced by the upstream's."""
    if not advertised.startswith("tcp://"):
        return advertised
    host, sep, port = advertised.removeprefix("tcp://").rpartition(":")
    if not sep:
        raise ValueError(f"bad KV events endpoint {advertised!r}")
    if host in WILDCARD_HOSTS:
        host = urlsplit(upstream_url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
    return f"tcp://{host}:{port}"


class _Subscription:
    """One upstream's SUB socket, its monitor, and the task applying its batches."""

    def __init__(
        self,
        url: str,
        info: dict[str, object],
        ctx: zmq.asyncio.Context,
        index: KvIndex,
        metrics: KvMetrics,
    ) -> None:
        self.url, self.index, self.metrics, self.ctx = url, index, metrics, ctx
        self.endpoint = events_endpoint(str(info["endpoint"]), url)
        replay = info.get("replay_endpoint")
        self.replay = events_endpoint(replay, url) if isinstance(replay, str) else None
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, str(info.get("topic") or "").encode())
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        # The last seq a replay applied: the live copies of it and of those before are skipped.
        self._replayed = -1
        self.sock.connect(self.endpoint)
        self.tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._watch())]

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disable_monitor()
        self.monitor.close(linger=0)
        self.sock.close(linger=0)

    def _drop(self, reason: str) -> None:
        self.index.drop(self.url, reason)
        self.metrics.blocks.labels(self.url).set(0)

    async def _watch(self) -> None:
        while True:
            event = parse_monitor_message(await self.monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                log.info("KV events of %s: disconnected, its index dropped", self.url)
                self._replayed = -1  # a restarted publisher counts from 0 again
                self._drop("disconnected")

    async def _read(self) -> None:
        if self.replay is not None:  # what it published before this subscription
            await self._replay(0, None)
        while True:
            frames = await self.sock.recv_multipart()
            try:
                if len(frames) != 3:
                    raise ValueError(f"{len(frames)} frames, not 3")
                seq, batch = parse_seq(frames[1]), decode_batch(frames[2])
            except ValueError as e:
                log.warning("KV events of %s: bad message (%s), its index dropped", self.url, e)
                self._drop("bad_message")
                continue
            if seq <= self._replayed:
                continue  # sent live while the replay ran: applied already
            self._replayed = -1
            last = self.index.last_seq(self.url)
            missed = seq > 0 if last is None else seq > last + 1
            if missed and self.replay is not None:
                await self._replay(0 if last is None else last + 1, seq)
            self._apply(seq, batch)

    def _apply(self, seq: int, batch: KVEventBatch) -> None:
        self.index.apply(self.url, seq, batch)
        self.metrics.batches.labels(self.url).inc()
        self.metrics.blocks.labels(self.url).set(self.index.blocks(self.url))

    async def _replay(self, start: int, until: int | None) -> None:
        """Apply the buffered batches [start, until) the publisher still has (vLLM's replay);
        `until` None: all of them."""
        assert self.replay is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay)
            await dealer.send_multipart((b"", seq_bytes(start)))
            async with asyncio.timeout(REPLAY_TIMEOUT_S):
                while True:
                    frames = await dealer.recv_multipart()  # [b"", seq, payload]
                    seq = parse_seq(frames[-2])
                    if seq < 0:
                        return
                    if until is None or seq < until:
                        self._apply(seq, decode_batch(frames[-1]))
                        self._replayed = max(self._replayed, seq)
        except (TimeoutError, ValueError, IndexError, zmq.ZMQError) as e:
            log.warning("KV events of %s: replay from %d failed: %s", self.url, start, e)
        finally:
            dealer.close(linger=0)


class KvSubscriber:
    def __init__(
        self,
        pool: UpstreamPool,
        index: KvIndex,
        client: httpx.AsyncClient,
        registry: CollectorRegistry,
        tokenizer: str,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self.pool, self.index, self.client = pool, index, client
        self.metrics = KvMetrics(registry)
        index.on_drop = lambda url, reason: self.metrics.drops.labels(url, reason).inc()
        self.tokenizer = tokenizer
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._subs: dict[str, _Subscription] = {}

    async def run(self) -> None:
        """Until cancelled: the tokenizer loaded (off the event loop), then the subscriptions
        kept in step with the pool and what each upstream advertises."""
        loading = asyncio.create_task(self._load_tokenizer())  # while subscribing
        ctx = zmq.asyncio.Context()
        try:
            while True:
                urls = {u.url for u in self.pool.all()}
                for url in [u for u in self._subs if u not in urls]:
                    await self._forget(url)
                await asyncio.gather(*(self._refresh(url, ctx) for url in urls))
                await asyncio.sleep(self.interval_s)
        finally:
            loading.cancel()
            for sub in self._subs.values():
                await sub.close()
            ctx.destroy(linger=0)

    async def _load_tokenizer(self) -> None:
        try:
            await asyncio.to_thread(load_tokenizer, self.tokenizer)
        except (OSError, ValueError) as e:  # routed by load alone until it can be read
            log.error("kv_aware: cannot read the tokenizer of %s: %s", self.tokenizer, e)

    async def _forget(self, url: str) -> None:
        await self._subs.pop(url).close()
        self.index.forget(url)
        with contextlib.suppress(KeyError):
            self.metrics.blocks.remove(url)

    async def _refresh(self, url: str, ctx: zmq.asyncio.Context) -> None:
        try:
            r = await self.client.get(url + "/version", timeout=self.timeout_s)
            info = r.json().get("kv_events") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return  # down or restarting: the socket reconnects by itself, the monitor drops
        sub = self._subs.get(url)
        if not isinstance(info, dict) or info.get("hash") != HASH_SCHEME:
            if sub is not None:  # events turned off, or hashed otherwise: nothing to match
                await self._forget(url)
            return
        try:
            endpoint = events_endpoint(str(info.get("endpoint")), url)
        except ValueError as e:
            log.warning("upstream %s: %s", url, e)
            return
        if sub is not None and sub.endpoint == endpoint:
            return
        if sub is not None:  # it publishes elsewhere now (a restart on another port)
            await self._subs.pop(url).close()
            self.index.drop(url, "moved")
        if isinstance(size := info.get("block_size"), int):
            self.index.set_block_size(url, size)
        self._subs[url] = _Subscription(url, info, ctx, self.index, self.metrics)
        self.metrics.blocks.labels(url).set(self.index.blocks(url))  # subscribed: it shows
        log.info("upstream %s: KV events from %s", url, endpoint)
