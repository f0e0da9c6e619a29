"""Per-key limits of the Batch API's routes (files, bytes, batches in flight), on the real
routes and store in process (the runner is not started: batches stay in validating)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from surge.batch import routes
from surge.batch.config import BatchConfig
from surge.batch.lines import Claim
from surge.batch.runner import Answer
from surge.batch.service import BatchService
from surge.server.errors import install_error_handlers
from tests.batch.helpers import CHAT, chat_line


async def _never(c: Claim, timeout_s: float) -> Answer:
    raise AssertionError("the runner is not started here")


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    config = BatchConfig(max_files_per_key=3, max_bytes_per_key=2000, max_batches_per_key=1)
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(routes.router)
    app.state.batch = BatchService(config, tmp_path, _never, lambda: 1)
    with TestClient(app) as client:
        yield client
    app.state.batch.astore.store.close()


def _upload(api: TestClient, key: str, text: str) -> httpx.Response:
    files = {"file": ("in.jsonl", text.encode())}
    auth = {"authorization": f"Bearer {key}"}
    return api.post("/v1/files", headers=auth, files=files, data={"purpose": "batch"})


def test_files_per_key(api: TestClient) -> None:
    for _ in range(3):
        assert _upload(api, "a", chat_line("x")).status_code == 200
    r = _upload(api, "a", chat_line("x"))
    assert r.status_code == 429 and r.json()["error"]["code"] == "files_limit_reached"
    assert "--batch-max-files-per-key" in r.json()["error"]["message"]
    assert r.headers["retry-after"]
    assert _upload(api, "b", chat_line("x")).status_code == 200  # another key's own count


def test_bytes_per_key(api: TestClient) -> None:
    big = "\n".join(chat_line(f"r{i}", "z" * 300) for i in range(4))  # ~1.8 KB
    assert _upload(api, "a", big).status_code == 200
    r = _upload(api, "a", big)
    assert r.status_code == 429 and r.json()["error"]["code"] == "bytes_limit_reached"
    listed = api.get("/v1/files", headers={"authorization": "Bearer a"}).json()["data"]
    assert len(listed) == 1  # the refused upload left nothing behind


def test_batches_in_flight_per_key(api: TestClient) -> None:
    auth = {"authorization": "Bearer a"}
    fid = _upload(api, "a", chat_line("x")).json()["id"]
    body = {"input_file_id": fid, "endpoint": CHAT, "completion_window": "1h"}
    first = api.post("/v1/batches", json=body, headers=auth)
    assert first.status_code == 200 and first.json()["status"] == "validating"
    r = api.post("/v1/batches", json=body, headers=auth)
    assert r.status_code == 429 and r.json()["error"]["code"] == "batches_limit_reached"
    api.post(f"/v1/batches/{first.json()['id']}/cancel", headers=auth)
    # cancelling counts until the runner has closed it: still in flight
    assert api.post("/v1/batches", json=body, headers=auth).status_code == 429
