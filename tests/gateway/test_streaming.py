"""SSE framing: only whole events are relayed."""

from __future__ import annotations

from surge.gateway.streaming import ends_stream, split_events


def test_split_events_keeps_the_unfinished_event_back() -> None:
    assert split_events(b"data: 1\n\ndata: 2\n\nda") == (b"data: 1\n\ndata: 2\n\n", b"da")
    assert split_events(b'data: {"a": ') == (b"", b'data: {"a": ')
    assert split_events(b"data: 1\r\n\r\ndata: 2") == (b"data: 1\r\n\r\n", b"data: 2")
    assert split_events(b"") == (b"", b"")


def test_a_stream_ends_whole_with_done_or_a_responses_last_event() -> None:
    assert ends_stream(b'data: {"x": 1}\n\ndata: [DONE]\n\n')
    assert ends_stream(b'event: response.completed\ndata: {"type": "response.completed"}\n\n')
    assert ends_stream(b"event: response.output_text.delta\ndata: {}\n\nevent: error\ndata: {}")
    assert not ends_stream(b"event: response.output_text.delta\ndata: {}\n\n")
    # the words inside a delta's JSON (where a newline is escaped) are not an event
    assert not ends_stream(b'data: {"delta": "event: response.completed"}\n\n')
