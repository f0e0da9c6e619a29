"""Whole messages from the engine's pipe without ever blocking the event loop.

A message bigger than the pipe's buffer (64 KiB on Linux: prompt logprobs of a long prompt, a
step's outputs for many requests) arrives in several writes. uvloop's add_reader makes the fd
non-blocking, so `Connection.recv()` called on the first readable event raised BlockingIOError
halfway through such a message, which was taken for the engine's death: the server exited.
This reads what is there, keeps a partial message for the next event, and decodes the
multiprocessing.Connection framing (a 4-byte big-endian length, or -1 and an 8-byte one).
"""

from __future__ import annotations

import os
import struct
from multiprocessing.reduction import ForkingPickler
from typing import Any

# A Linux pipe holds 64 KiB (by default): one read returns no more, so a larger buffer would
# only be allocated, at every read (twice a step), to go unused.
_CHUNK = 1 << 16


class PipeReader:
    """Reads a pipe's read end, set non-blocking here whatever the event loop does."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self._buf = bytearray()

    def read(self) -> tuple[list[Any], bool]:
        """(the messages complete so far, whether the writer has closed its end). Reads until
        the pipe is empty; call it on each readable event."""
        while True:
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return self._messages(), False
            if not chunk:
                return self._messages(), True
            self._buf += chunk

    def _messages(self) -> list[Any]:
        out: list[Any] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = struct.unpack_from("!i", buf, pos)
            start = pos + 4
            if size == -1:
                if len(buf) - start < 8:
                    break
                (size,) = struct.unpack_from("!Q", buf, start)
                start += 8
            if len(buf) - start < size:
                break
            out.append(ForkingPickler.loads(buf[start : start + size]))  # one copy
            pos = start + size
        del buf[:pos]
        return out
