"""A bounded closed-loop load for tests: `concurrency` clients each send one completion after
another until stopped, from an event loop in a thread of its own (the test polls meanwhile)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import httpx


def words(n: int, seed: int = 0) -> str:
    """A prompt of about n tokens for the tiny model's tokenizer (distinct words per seed)."""
    return " ".join(f"w{(seed * 7919 + i) % 997}" for i in range(n))


class Load:
    def __init__(
        self,
        url: str,
        concurrency: int,
        body: dict[str, Any],
        *,
        stream: bool = False,
        vary_prompt: bool = False,
    ) -> None:
        self.url = url
        self.concurrency = concurrency
        self.body = body
        self.stream = stream
        self.vary_prompt = vary_prompt
        self.statuses: Counter[int] = Counter()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop at once: requests in flight are dropped (the server aborts them)."""
        self._stop.set()
        if self._loop is not None and self._main is not None:
            self._loop.call_soon_threadsafe(self._main.cancel)
        self._thread.join(30)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._main = asyncio.current_task()
        self._started.set()
        limits = httpx.Limits(max_connections=self.concurrency + 4)
        try:
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                await asyncio.gather(*(self._client(client, i) for i in range(self.concurrency)))
        except asyncio.CancelledError:
            pass

    async def _client(self, client: httpx.AsyncClient, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            body = dict(self.body, stream=self.stream)
            if self.vary_prompt:  # no prefix cache hits across requests
                body["prompt"] = f"c{i} n{n} " + body["prompt"]
            n += 1
            try:
                if self.stream:
                    async with client.stream("POST", self.url + "/v1/completions", json=body) as r:
                        async for _ in r.aiter_lines():
                            pass
                else:
                    r = await client.post(self.url + "/v1/completions", json=body)
                self.statuses[r.status_code] += 1
                if r.status_code == 429:
                    await asyncio.sleep(0.05)  # keep hitting the door, not spinning
            except httpx.HTTPError:
                self.statuses[0] += 1
