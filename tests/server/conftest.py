"""The shared tiny-model server for the server tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ServerProcess


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tiny_model_dir, "--dtype", "float32")
    yield server
    server.stop()
