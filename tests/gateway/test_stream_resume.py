"""A stream whose upstream is killed -9 mid-answer goes on, on another upstream, from where it
stopped: the client sees one unbroken stream (one id, one opening, the text before the kill then
the rest, `max_tokens` in all), for a completion and for a chat. Real `surge serve` processes of
the tiny model behind a real `surge gateway`."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from surge.gateway.resume import StreamResume
from tests.gateway.processes import GatewayProcess
from tests.servers import ServerProcess

MAX_TOKENS = 1200  # long enough to be mid-answer when the kill lands


@pytest.fixture(scope="module")
def fleet(tiny_model_dir: Path) -> Iterator[tuple[list[ServerProcess], GatewayProcess]]:
    with ThreadPoolExecutor(2) as pool:
        servers = list(pool.map(lambda _: ServerProcess(tiny_model_dir, "--dtype", "float32"),
                                range(2)))  # fmt: skip
    # Session affinity: both streams of the test go to one upstream, which one kill breaks.
    gateway = GatewayProcess(*[a for s in servers for a in ("--upstream", s.url)],
                             "--policy", "session", "--health-interval", "0.5",
                             "--health-timeout", "2")  # fmt: skip
    try:
        gateway.wait_ready(num_upstreams=2)
        yield servers, gateway
    finally:
        gateway.stop()
        for s in servers:
            s.stop()


def _text(path: str, events: list[dict[str, Any]]) -> str:
    if path == "/v1/completions":
        return "".join(c["text"] for e in events for c in e.get("choices", []))
    return "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))


class _Stream(threading.Thread):
    """One streamed request through the gateway, read event by event."""

    def __init__(self, gateway: GatewayProcess, path: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.body = gateway.url + path, path, body
        self.events: list[dict[str, Any]] = []
        self.upstream = ""
        self.started = threading.Event()  # 30 events in: mid-answer
        self.before = ""  # the text when the kill may come

    def run(self) -> None:
        headers = {"x-session-id": "one-upstream"}
        with httpx.stream("POST", self.url, json=self.body, headers=headers, timeout=120) as r:
            self.upstream = r.headers["x-surge-upstream"]
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    self.events.append(json.loads(line[6:]))
                    if len(self.events) == 30:
                        self.before = _text(self.path, self.events)
                        self.started.set()
                        self.go_on.wait(30)  # the kill lands while this stream is open

    go_on = threading.Event()


def test_streams_killed_mid_answer_go_on_elsewhere(
    fleet: tuple[list[ServerProcess], GatewayProcess],
) -> None:
    """A completion and a chat streaming from one upstream when it is killed -9."""
    servers, gateway = fleet
    common = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True, "stream": True,
              "stream_options": {"include_usage": True}}  # fmt: skip
    story = [{"role": "user", "content": "Tell me a story."}]
    streams = [_Stream(gateway, "/v1/completions", {"prompt": "Once upon a time", **common}),
               _Stream(gateway, "/v1/chat/completions", {"messages": story, **common})]  # fmt: skip
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.started.wait(60)
    (victim,) = {stream.upstream for stream in streams}
    os.kill(next(s for s in servers if s.url == victim).proc.pid, signal.SIGKILL)
    _Stream.go_on.set()
    for stream in streams:
        stream.join(120)
        events, path = stream.events, stream.path
        assert all("error" not in e for e in events), events[-2:]
        assert {e["id"] for e in events} == {events[0]["id"]}
        text = _text(path, events)
        assert text.startswith(stream.before) and len(text) > len(stream.before)
        finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
        assert finishes == ["length"]
        assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS  # across both parts
        if path == "/v1/chat/completions":  # one opening, as an unbroken stream has
            roles = [c["delta"].get("role") for e in events for c in e["choices"]]
            assert roles.count("assistant") == 1
    name = 'surge_gateway_stream_resumes_total{outcome="resumed"}'
    resumed = [ln for ln in gateway.metrics().splitlines() if ln.startswith(name)]
    assert resumed and float(resumed[0].rsplit(" ", 1)[1]) == 2


def test_what_cannot_go_on_is_not_planned() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert StreamResume.plan("/v1/chat/completions", chat) is not None
    for extra in ({"tools": [{"type": "function", "function": {"name": "f"}}]}, {"n": 2},
                  {"logprobs": True}, {"response_format": {"type": "json_object"}},
                  {"stream": False}, {"structured_outputs": {"regex": "a+"}},
                  {"response_format": "not an object"}):  # fmt: skip
        assert StreamResume.plan("/v1/chat/completions", {**chat, **extra}) is None, extra
    assert StreamResume.plan("/v1/completions", {"prompt": [1, 2], "stream": True}) is None
    assert (
        StreamResume.plan("/v1/completions", {"prompt": "x", "stream": True, "echo": True}) is None
    )
    plan = StreamResume.plan("/v1/completions", {"prompt": "Hi", "stream": True, "max_tokens": 5})
    assert plan is not None
    plan.observe(
        b'data: {"id": "c1", "created": 7, "choices": [{"index": 0, "text": " there"}]}\n\n'
    )
    assert json.loads(plan.continuation(2) or b"") == {"prompt": "Hi there", "stream": True,
                                                       "max_tokens": 3}  # fmt: skip
    assert plan.continuation(5) is None  # the limit reached as it broke: nothing to ask for
