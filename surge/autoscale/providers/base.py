"""The Provider protocol: start a replica (returns once it is healthy), drain one, list them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol


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
