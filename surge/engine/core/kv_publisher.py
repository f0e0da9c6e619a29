"""Publish the prefix cache's KV events from the engine process (vLLM's ZMQ format).

Why here and not in the API process: the events are born in the engine's step loop, and
sending them from there costs one msgpack encode and a non-blocking ZMQ send per step with
events (ZMQ's own I/O thread does the writing), where a detour through the API process would
pickle them over the engine's pipe as well and make their order depend on two event loops.
The replay socket is served by a daemon thread of its own, so a slow subscriber asking for
missed batches never delays a step.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque

import zmq

from surge.engine.config import KVEventsConfig
from surge.kv_events.wire import END_SEQ, KVEvent, KVEventBatch, encode_batch, message, seq_bytes

log = logging.getLogger(__name__)

SEND_HWM = 100_000  # batches queued for slow subscribers before ZMQ drops (PUB never blocks)


class KVEventPublisher:
    """A PUB socket (and optionally a ROUTER for replay); `publish` is called by the step loop."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int | None = None) -> None:
        if config.endpoint is None:
            raise ValueError("KV events need an endpoint")
        self._ctx = zmq.Context()
        self._rank = data_parallel_rank
        self._topic = config.topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._lock = threading.Lock()  # the buffer: appended here, read by the replay thread
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._pub.setsockopt(zmq.LINGER, 0)
        try:
            self._pub.bind(config.endpoint)
        except zmq.ZMQError as e:
            self._ctx.destroy(linger=0)
            raise OSError(f"--kv-events-endpoint {config.endpoint}: {e}") from None
        # The address bound (a port given as * resolved): what /version advertises.
        self.endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.topic = config.topic
        self.replay_endpoint: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if config.replay_endpoint is not None:
            router = self._ctx.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            try:
                router.bind(config.replay_endpoint)
            except zmq.ZMQError as e:
                self._ctx.destroy(linger=0)
                raise OSError(
                    f"--kv-events-replay-endpoint {config.replay_endpoint}: {e}"
                ) from None
            self.replay_endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(
                target=self._serve_replay, args=(router,), name="kv-events-replay", daemon=True
            )
            self._thread.start()
        log.info("KV events on %s (replay: %s)", self.endpoint, self.replay_endpoint or "none")

    def publish(self, events: list[KVEvent]) -> None:
        """Send one batch now; a subscriber too slow to take it loses it (and sees the gap)."""
        payload = encode_batch(KVEventBatch(time.time(), events, self._rank))
        seq = self._seq
        self._seq += 1
        with self._lock:
            self._buffer.append((seq, payload))
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart(message(self._topic, seq, payload), flags=zmq.NOBLOCK)

    def _serve_replay(self, router: zmq.Socket) -> None:
        """[identity, b"", start seq] in; [identity, b"", seq, payload] for each buffered batch
        from start on, then [identity, b"", -1, b""] out (vLLM's replay protocol)."""
        try:
            while not self._stop.is_set():
                if not router.poll(100):
                    continue
                frames = router.recv_multipart()
                if len(frames) != 3 or len(frames[2]) != 8:
                    log.warning("bad KV-events replay request (%d frames)", len(frames))
                    continue
                client, _, start = frames
                first = int.from_bytes(start, "big", signed=True)
                with self._lock:
                    batches = [(s, p) for s, p in self._buffer if s >= first]
                for seq, payload in batches:
                    router.send_multipart((client, b"", seq_bytes(seq), payload))
                router.send_multipart((client, b"", END_SEQ, b""))
        finally:
            router.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self._pub.close(linger=0)
        if self._thread is None or not self._thread.is_alive():
            self._ctx.term()  # (a replay thread still in a send would make term() wait)
