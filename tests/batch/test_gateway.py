"""The Batch API on a real `surge gateway` over two real replicas: lines spread over both, a
replica killed mid-batch has its lines run on the other, the gateway killed mid-batch resumes
it on restart, and every line is in the output exactly once. A data folder that cannot be used
leaves the Batch API answering 503 and the proxy serving (the server and the gateway share
that code: surge/batch/service.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.batch.helpers import (
    KEY_A,
    KEYS,
    QUICK,
    assert_each_line_once,
    chat_lines,
    client,
    completed,
    submit,
    wait_done,
    wait_until,
)
from tests.batch.test_restart import kill_server
from tests.gateway.processes import GatewayProcess
from tests.servers import ServerProcess


@pytest.fixture(scope="module")
def replicas(
    batch_server: ServerProcess, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServerProcess]]:
    """The folder's server and one more (the one the first test kills)."""
    data = tmp_path_factory.mktemp("replica")
    other = ServerProcess(tiny_model_dir, *QUICK, *KEYS, "--data-dir", str(data))
    yield [batch_server, other]
    other.stop()


def _gateway(replicas: list[ServerProcess], data: Path, port: int | None = None) -> GatewayProcess:
    ups = [a for s in replicas for a in ("--upstream", s.url)]
    g = GatewayProcess(*ups, "--data-dir", str(data), "--batch-max-concurrency", "3",
                       "--health-interval", "0.5", port=port)  # fmt: skip
    g.wait_ready(num_upstreams=len(replicas))
    return g


def _served(s: ServerProcess) -> float:
    return s.metric("vllm:generation_tokens_total")


def test_a_batch_spreads_over_the_replicas_and_survives_one_killed(
    replicas: list[ServerProcess], tmp_path: Path
) -> None:
    g = _gateway(replicas, tmp_path)
    try:
        c = client(g.url)
        before = [_served(s) for s in replicas]
        b = submit(c, chat_lines(30, max_tokens=24, ignore_eos=True))
        mid = wait_until(c, b.id, lambda x: completed(x) >= 4)
        assert mid.status == "in_progress" and completed(mid) < 30
        assert all(_served(s) > n for s, n in zip(replicas, before, strict=True))  # both work
        kill_server(replicas[1])  # with lines in flight on it
        b = wait_done(c, b.id, timeout_s=90)
        killed = f'upstream="{replicas[1].url}"'
        assert any(
            killed in line
            for line in g.metrics().splitlines()
            if line.startswith("surge_gateway_upstream_errors_total")
        )  # hit mid-line
        assert b.status == "completed"
        assert_each_line_once(c, b, 30)
        assert b.request_counts is not None and b.request_counts.completed == 30
    finally:
        g.stop()


def test_a_gateway_killed_mid_batch_resumes_on_restart(
    replicas: list[ServerProcess], tmp_path: Path
) -> None:
    live = [s for s in replicas if s.proc.poll() is None]
    g = _gateway(live, tmp_path)
    c = client(g.url)
    b = submit(c, chat_lines(10, max_tokens=24, ignore_eos=True))
    mid = wait_until(c, b.id, lambda x: completed(x) >= 2)
    assert mid.status == "in_progress" and completed(mid) < 10  # killed mid-batch
    g.proc.kill()
    g.proc.wait(10)
    g.stop()
    again = _gateway(live, tmp_path, port=g.port)
    try:
        c = client(again.url)
        b = wait_done(c, b.id, timeout_s=90)
        assert b.status == "completed"
        assert_each_line_once(c, b, 10)
    finally:
        again.stop()


def test_an_unusable_data_folder_leaves_the_gateway_serving(
    replicas: list[ServerProcess], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    g = _gateway(replicas[:1], blocker / "data")
    try:
        auth = {"authorization": f"Bearer {KEY_A}"}
        chat = httpx.post(g.url + "/v1/chat/completions", headers=auth, timeout=30,
                          json={"model": "test-model", "max_tokens": 2,
                                "messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
        assert chat.status_code == 200, chat.text
        for method, path in (("GET", "/v1/files"), ("POST", "/v1/batches")):
            r = httpx.request(method, g.url + path, json={}, headers=auth, timeout=10)
            assert r.status_code == 503, r.text
            assert "not usable" in r.json()["error"]["message"]
        assert "surge:batch_storage_ok 0.0" in g.metrics()
    finally:
        g.stop()
