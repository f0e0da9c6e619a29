"""The Provider protocol: start a replica (returns once it is healthy), drain one, list them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import httpx


class ReplicaState(Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


class ReplicaStartError(Exception):
    """A replica did not become healthy; the provider has stopped what it started."""


@dataclass(eq=False)
class Replica:
    id: str
    url: str
    state: ReplicaState = ReplicaState.STARTING
    started_s: float = 0.0
    pid: int | None = None
    exit_code: int | None = None
    labels: dict[str, str] = field(default_factory=dict)


class Provider(Protocol):
    async def start(self) -> Replica:
        """A new replica, returned once its /health answers 200; ReplicaStartError otherwise."""
        ...

    async def drain(self, replica: Replica, timeout_s: float) -> None:
        """Ask the replica to finish its in-flight requests and stop (SIGTERM for a
        `surge serve`); stop it hard after `timeout_s`."""
        ...

    def alive(self, replica: Replica) -> bool:
        """False once the replica's process has exited on its own."""
        ...

    def replicas(self) -> list[Replica]: ...

    async def refresh(self) -> None:
        """Bring what `alive` answers up to date (a remote provider asks its nodes)."""
        ...

    async def close(self, timeout_s: float) -> None:
        """Drain every replica this provider started."""
        ...


async def wait_healthy(
    url: str,
    what: str,
    running: Callable[[], Awaitable[bool]],
    timeout_s: float,
    where: str,
    poll_s: float = 0.3,
) -> None:
    """Until `url`/health answers 200; ReplicaStartError if the process stops running first
    (`running`) or `timeout_s` passes. `what` names it, `where` says where to look (its log)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not await running():
                raise ReplicaStartError(f"{what} exited while starting; see {where}")
            try:
                if (await client.get(url + "/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(poll_s)
    raise ReplicaStartError(f"{what} not healthy in {timeout_s:.0f}s; see {where}")
