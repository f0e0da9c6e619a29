"""The KEDA scaler's parts as plain objects: the decision board, the observed provider, the
observe-mode flags, and the committed stubs against a fresh protoc run."""

from __future__ import annotations

import argparse
import asyncio
import socket
from pathlib import Path

import pytest

from surge.autoscale.observe import add_observe_flags, observed_provider
from surge.autoscale.providers.base import ReplicaStartError, ReplicaState
from surge.autoscale.providers.observed import ObservedConfig, ObservedProvider
from surge.http.discovery import DnsTarget, resolve
from tests.autoscale.keda_client import generate

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_are_what_protoc_makes(tmp_path: Path) -> None:
    made = generate(tmp_path, "surge/autoscale/keda/externalscaler.proto")
    for path in made:
        committed = ROOT / path.relative_to(tmp_path)
        assert committed.read_text() == path.read_text(), (
            f"{committed} is not protoc's output: regenerate (surge/autoscale/keda/__init__.py)"
        )


def test_view_is_active_on_replicas_or_pending_requests() -> None:
    from surge.autoscale.keda.board import View

    assert not View(0, 0.0).active
    assert View(1, 0.0).active
    assert View(0, 2.0).active  # a queue with no decision for it yet still wakes the fleet


async def test_board_waits_for_first_decision_and_wakes_streams() -> None:
    from surge.autoscale.keda.board import Board

    board = Board()
    assert await board.wait(0.01) is None
    waiter = asyncio.create_task(board.next())
    await asyncio.sleep(0)
    board.update(3, 1.0)
    view = await asyncio.wait_for(waiter, 5)
    assert (view.desired, view.pending) == (3, 1.0)
    assert await board.wait(0.01) == view


async def test_observed_provider_follows_the_resolver() -> None:
    answers = {"now": ("http://10.0.0.1:8000", "http://10.0.0.2:8000")}
    target = DnsTarget("surge-replicas", 8000)
    provider = ObservedProvider(
        ObservedConfig(target, ("http://10.0.0.9:8000",)),
        resolver=lambda t: answers["now"] if t == target else (),
        clock=lambda: 5.0,
    )
    await provider.refresh()
    first = {r.url: r for r in provider.replicas()}
    assert sorted(first) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.9:8000"]
    assert all(r.state is ReplicaState.READY and provider.alive(r) for r in first.values())
    answers["now"] = ("http://10.0.0.2:8000",)  # a pod went away
    await provider.refresh()
    kept = {r.url: r for r in provider.replicas()}
    assert sorted(kept) == ["http://10.0.0.2:8000", "http://10.0.0.9:8000"]
    assert kept["http://10.0.0.2:8000"] is first["http://10.0.0.2:8000"]  # same replica object
    with pytest.raises(ReplicaStartError):
        await provider.start()

    def no_answer(t: DnsTarget) -> tuple[str, ...]:
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    provider._resolve = no_answer  # the DNS server stops answering for a while
    await provider.refresh()
    assert sorted(r.url for r in provider.replicas()) == sorted(kept)  # none dropped for it


def test_resolve_tells_no_address_from_no_answer() -> None:
    """A name with no address is an empty fleet; only a failure to ask raises (kept fleet)."""
    assert resolve(DnsTarget("no-such-name.invalid", 8000)) == ()
    assert resolve(DnsTarget("localhost", 8000)) != ()


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_observe_flags(p)
    return p.parse_args(argv)


def test_observe_flags() -> None:
    assert observed_provider(_args(), ["--model", "x"]) is None  # local mode
    provider = observed_provider(
        _args("--discover", "dns://surge-replicas:8000", "--upstream", "http://a:1/"), []
    )
    assert provider is not None
    assert provider.config == ObservedConfig(DnsTarget("surge-replicas", 8000), ("http://a:1",))
    with pytest.raises(SystemExit, match="starts no replica"):
        observed_provider(_args("--upstream", "http://a:1"), ["--model", "x"])
    with pytest.raises(SystemExit, match="dns://NAME:PORT"):
        observed_provider(_args("--discover", "surge-replicas:8000"), [])
    with pytest.raises(SystemExit, match="observe mode"):
        observed_provider(_args("--gateway-url", "http://g:1"), [])
