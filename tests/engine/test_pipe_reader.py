"""PipeReader: whole engine messages from a non-blocking pipe, however the writes split them."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import select
import struct
import threading

from surge.engine.client.pipe_reader import PipeReader


def test_messages_bigger_than_the_pipe_arrive_whole_and_in_order() -> None:
    """A 1 MiB message cannot be written at once (the pipe holds 64 KiB): the reader sees its
    first part, must keep it, and returns the message when the rest has come."""
    read_end, write_end = mp.get_context("spawn").Pipe(duplex=False)
    reader = PipeReader(read_end.fileno())
    sent = [{"i": 0, "blob": b"x" * (1 << 20)}, "small", list(range(50_000)), {"i": 3}]

    def write() -> None:
        for msg in sent:
            write_end.send(msg)
        write_end.close()

    writer = threading.Thread(target=write)
    writer.start()
    got: list[object] = []
    reads = 0
    closed = False
    while not closed:
        select.select([read_end.fileno()], [], [], 5)
        messages, closed = reader.read()
        got += messages
        reads += 1
    writer.join()
    assert got == sent
    assert reads > 1  # it did arrive in parts


def test_the_eight_byte_length_header() -> None:
    """multiprocessing frames a message over 2 GiB with -1 and an 8-byte length."""
    r, w = os.pipe()
    try:
        reader = PipeReader(r)
        payload = pickle.dumps({"big": True})
        os.write(w, struct.pack("!i", -1) + struct.pack("!Q", len(payload)))
        assert reader.read() == ([], False)  # the length alone: nothing yet
        os.write(w, payload[:5])
        assert reader.read() == ([], False)
        os.write(w, payload[5:])
        assert reader.read() == ([{"big": True}], False)
    finally:
        os.close(w)
    assert reader.read() == ([], True)
    os.close(r)
