"""surge/http/disconnect.py: work raced against the client's disconnect (the server's and the
gateway's), over a real Starlette Request whose ASGI channel the test drives."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request
from starlette.types import Message

from surge.http.disconnect import done_before_disconnect, wait_disconnect


def request_with(channel: asyncio.Queue[Message]) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, channel.get)


async def test_work_done_first_is_true_and_stops_watching() -> None:
    channel: asyncio.Queue[Message] = asyncio.Queue()
    work = asyncio.ensure_future(asyncio.sleep(0.01, "answer"))
    assert await done_before_disconnect(work, request_with(channel)) is True
    assert work.result() == "answer"
    await asyncio.sleep(0)
    channel.put_nowait({"type": "http.disconnect"})  # no watcher left to take it
    assert channel.qsize() == 1


async def test_disconnect_first_is_false_and_leaves_the_work_to_the_caller() -> None:
    channel: asyncio.Queue[Message] = asyncio.Queue()
    channel.put_nowait({"type": "http.request", "body": b"{}", "more_body": False})
    channel.put_nowait({"type": "http.disconnect"})
    work = asyncio.ensure_future(asyncio.sleep(60))
    assert await asyncio.wait_for(done_before_disconnect(work, request_with(channel)), 10) is False
    assert not work.done()  # the caller cancels it its own way (abort in the engine)
    work.cancel()


async def test_an_interrupted_wait_cancels_the_work() -> None:
    channel: asyncio.Queue[Message] = asyncio.Queue()
    work = asyncio.ensure_future(asyncio.sleep(60))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await done_before_disconnect(work, request_with(channel))
    await asyncio.sleep(0)
    assert work.cancelled()


async def test_wait_disconnect_skips_body_chunks() -> None:
    channel: asyncio.Queue[Message] = asyncio.Queue()
    for _ in range(3):
        channel.put_nowait({"type": "http.request", "body": b"x", "more_body": True})
    channel.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(wait_disconnect(request_with(channel)), 10)
    assert channel.empty()
