"""A bounded background load: a few clients sending short requests in a loop, each outcome kept."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True, slots=True)
class Result:
    t_end: float  # time.monotonic()
    latency_s: float
    status: int  # 0: no HTTP answer (a connection error)
    upstream: str  # the gateway's x-surge-upstream, when there is one
    body: str


STREAM_BROKEN = 599  # a 200 whose event stream ended in an error event or without [DONE]


def _stream_whole(text: str) -> bool:
    events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
    return bool(events) and events[-1] == "[DONE]" and not any('"error"' in e for e in events)


class Load:
    """`clients` threads, each sending `max_tokens`-token completions one after another to
    `url` until stop(); at most `max_requests` in all, so the load is bounded."""

    def __init__(self, url: str, clients: int = 3, max_tokens: int = 4,
                 max_requests: int = 2000, timeout_s: float = 30.0,
                 stream: bool = False) -> None:  # fmt: skip
        self.url, self.max_tokens, self.timeout_s = url, max_tokens, timeout_s
        self.stream = stream
        self.results: list[Result] = []
        self._left = max_requests
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[Result]:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 10)
        return self.results

    def _run(self) -> None:
        body = {"prompt": "a bounded load", "max_tokens": self.max_tokens, "ignore_eos": True,
                "stream": self.stream}  # fmt: skip
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                with self._lock:
                    if self._left <= 0:
                        return
                    self._left -= 1
                t0 = time.monotonic()
                try:
                    r = client.post(self.url + "/v1/completions", json=body)
                    status, upstream, text = (
                        r.status_code,
                        r.headers.get("x-surge-upstream", ""),
                        r.text,
                    )
                    if self.stream and status == 200 and not _stream_whole(text):
                        status = STREAM_BROKEN
                except httpx.HTTPError as e:
                    status, upstream, text = 0, "", repr(e)
                    time.sleep(0.05)
                now = time.monotonic()
                with self._lock:
                    self.results.append(Result(now, now - t0, status, upstream, text))

    def ok_since(self, t: float) -> int:
        with self._lock:
            return sum(r.status == 200 and r.t_end > t for r in self.results)
