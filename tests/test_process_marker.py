"""The `process` marker's scan (tests/process_marker.py): what starts a process is found through
tests, fixtures and the suite's helpers; in-process tests are left out of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_marker import _reaches
from tests.servers import ServerProcess


def _runs_a_child() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _calls_the_helper() -> None:
    _runs_a_child()


async def _spawns_with_asyncio() -> None:
    await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")


def _in_process() -> int:
    return sum(range(3))


def _starts_a_server(model: Path) -> None:
    ServerProcess(model).stop()  # its methods reach subprocess.Popen


def test_the_scan_follows_helpers_and_classes() -> None:
    assert _reaches(_runs_a_child, {})
    assert _reaches(_calls_the_helper, {})
    assert _reaches(_spawns_with_asyncio, {})
    assert _reaches(_starts_a_server, {})
    assert _reaches(lambda: [_calls_the_helper() for _ in range(2)], {})  # nested code too
    assert not _reaches(_in_process, {})


def test_real_tests_are_told_apart() -> None:
    from tests.engine import test_core_step
    from tests.server import test_launch

    assert _reaches(test_launch.test_sigterm_drains_in_flight_then_exits_zero, {})
    assert not _reaches(
        test_core_step.test_abort_mid_prefill_frees_its_blocks_and_spares_the_others, {}
    )


def test_fixtures_count_and_this_in_process_test_is_not_marked(
    request: pytest.FixtureRequest, tiny_model_dir: Path
) -> None:
    manager = request._fixturemanager  # pytest's fixture registry: the scan reads the same defs
    (server,) = manager.getfixturedefs("tiny_server", request.node) or ()
    (model,) = manager.getfixturedefs("tiny_model_dir", request.node) or ()
    assert _reaches(server.func, {})
    assert not _reaches(model.func, {})
    assert request.node.get_closest_marker("process") is None
