"""Batch lines behind real-time traffic on a real `surge serve`: an interactive request preempts
them; SIGKILL mid-batch and a restart lose no line and answer none twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.batch.helpers import (
    KEY_A,
    QUICK,
    assert_each_line_once,
    chat_lines,
    client,
    completed,
    submit,
    wait_done,
    wait_until,
)
from tests.servers import ServerProcess

ARGS = (*QUICK, "--api-key", KEY_A, "--max-num-seqs", "2", "--batch-max-concurrency", "2")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batch-restart")


@pytest.fixture(scope="module")
def first(tiny_model_dir: Path, data_dir: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(tiny_model_dir, *ARGS, "--data-dir", str(data_dir))
    yield s
    s.stop()


def kill_server(s: ServerProcess) -> None:
    """SIGKILL the API process, then its engine (which would notice its parent's death later)."""
    engine = psutil.Process(s.engine_pid())
    s.proc.kill()
    s.proc.wait(10)
    try:
        engine.wait(5)
    except psutil.TimeoutExpired:
        engine.kill()
        engine.wait(5)
    s.stop()  # closes its log


def test_an_interactive_request_preempts_running_batch_lines(first: ServerProcess) -> None:
    c = client(first.url)
    b = submit(c, chat_lines(4, prefix="slow", max_tokens=1500, ignore_eos=True))
    wait_until(c, b.id, lambda x: x.status == "in_progress")
    deadline = time.monotonic() + 30
    while first.metric("vllm:num_requests_running") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # both sequence slots held by batch lines
    before = first.metric("vllm:num_preemptions_total")
    t0 = time.monotonic()
    r = httpx.post(first.url + "/v1/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {KEY_A}"},
                   json={"model": "test-model", "max_tokens": 4,
                         "messages": [{"role": "user", "content": "Hi"}]})  # fmt: skip
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert first.metric("vllm:num_preemptions_total") > before
    now = c.batches.retrieve(b.id)
    assert now.request_counts is not None and now.request_counts.completed == 0, (took, now)
    c.batches.cancel(b.id)
    wait_done(c, b.id)


def test_a_server_killed_mid_batch_resumes_on_restart_with_each_line_once(
    first: ServerProcess, tiny_model_dir: Path, data_dir: Path
) -> None:
    c = client(first.url)
    b = submit(c, chat_lines(8, max_tokens=24, ignore_eos=True))
    mid = wait_until(c, b.id, lambda x: completed(x) >= 2)
    assert mid.status == "in_progress" and completed(mid) < 8  # killed mid-batch
    kill_server(first)
    again = ServerProcess(tiny_model_dir, *ARGS, "--data-dir", str(data_dir), port=first.port)
    try:
        c = client(again.url)
        b = wait_done(c, b.id, timeout_s=90)
        assert b.status == "completed"
        assert_each_line_once(c, b, 8)
        assert b.request_counts is not None and b.request_counts.completed == 8
    finally:
        again.stop()
