"""SSE framing: only whole events are relayed."""

from __future__ import annotations

from surge.gateway.streaming import split_events


def test_split_events_keeps_the_unfinished_event_back() -> None:
    assert split_events(b"data: 1\n\ndata: 2\n\nda") == (b"data: 1\n\ndata: 2\n\n", b"da")
    assert split_events(b'data: {"a": ') == (b"", b'data: {"a": ')
    assert split_events(b"data: 1\r\n\r\ndata: 2") == (b"data: 1\r\n\r\n", b"data: 2")
    assert split_events(b"") == (b"", b"")
