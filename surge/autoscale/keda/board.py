"""The autoscaler's latest decision as KEDA's questions need it (no gRPC here: plain objects)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class View:
    """One decision as KEDA sees it."""

    desired: int  # replicas decided on, after stabilization
    pending: float  # requests waiting at the replicas or held by the gateway

    @property
    def active(self) -> bool:
        return self.desired > 0 or self.pending > 0


class Board:
    """The latest decision, and a wake-up for the streams waiting on the next one. The
    controller calls `update` from its loop, the one the gRPC server runs on."""

    def __init__(self) -> None:
        self.latest: View | None = None
        self._next = asyncio.Event()

    def update(self, desired: int, pending: float) -> None:
        self.latest = View(desired, pending)
        self._next.set()
        self._next = asyncio.Event()

    async def wait(self, timeout_s: float) -> View | None:
        """The latest decision; before the first one, wait up to `timeout_s` for it."""
        if self.latest is None:
            next_ = self._next
            try:
                await asyncio.wait_for(next_.wait(), timeout_s)
            except TimeoutError:
                return None
        return self.latest

    async def next(self) -> View:
        """The decision after now."""
        await self._next.wait()
        assert self.latest is not None
        return self.latest
