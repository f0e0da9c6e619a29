"""Scheduling policies: a policy orders requests and never touches blocks or tensors."""

from __future__ import annotations

from typing import Protocol

from surge.engine.request import Request


class Policy(Protocol):
    def key(self, req: Request, now_s: float) -> tuple[float, ...]:
        """Sort key: smaller runs sooner; among running requests the largest is preempted first.

        Must be a total order (break ties by arrival) so that scheduling is deterministic.
        """
        ...

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        """Called for every request that gets `num_tokens` of compute in a step (accounting)."""
        ...


class FCFSPolicy:
    """First come, first served: order of arrival; the latest arrival is preempted first."""

    def key(self, req: Request, now_s: float) -> tuple[float, ...]:
        return (req.arrival_s, req.seq_no)

    def on_scheduled(self, req: Request, num_tokens: int) -> None:
        return None


def make_policy(name: str) -> Policy:
    if name == "fcfs":
        return FCFSPolicy()
    raise ValueError(f"unknown scheduling policy {name!r} (available: fcfs)")
