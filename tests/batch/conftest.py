"""One `surge serve` of the tiny model with the Batch API for the folder (the API tests, and one
of the gateway tests' replicas): two API keys, small upload limits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.batch.helpers import KEYS, QUICK
from tests.servers import ServerProcess

LIMITS = ("--batch-max-file-bytes", "60000", "--batch-max-lines", "100",
          "--batch-max-line-bytes", "2000")  # fmt: skip


@pytest.fixture(scope="session")
def batch_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("batch-data")
    s = ServerProcess(tiny_model_dir, *QUICK, *KEYS, "--data-dir", str(data), *LIMITS)
    yield s
    s.stop()
