"""The Batch API on a real `surge serve` (the tiny model), through the official openai client:
a batch end to end, bad input per line and at upload, tenants kept apart, cancel, metrics."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.batch.helpers import (
    CHAT,
    KEY_A,
    KEY_B,
    assert_each_line_once,
    chat_line,
    chat_lines,
    client,
    results,
    submit,
    wait_done,
    wait_until,
)
from tests.servers import ServerProcess


@pytest.fixture
def server(batch_server: ServerProcess) -> ServerProcess:
    return batch_server


def test_the_openai_client_runs_a_batch(server: ServerProcess) -> None:
    c = client(server.url)
    b = submit(c, chat_lines(6))
    assert b.status == "validating" and b.completion_window == "24h" and b.endpoint == CHAT
    b = wait_done(c, b.id)
    assert b.status == "completed" and b.completed_at and b.in_progress_at and b.finalizing_at
    assert_each_line_once(c, b, 6)
    out, err = results(c, b)
    assert err == [] and b.error_file_id is None
    assert [x["custom_id"] for x in out] == [f"r{i}" for i in range(6)]  # input order
    for x in out:
        assert x["id"].startswith("batch_req_") and x["error"] is None
        assert x["response"]["status_code"] == 200 and x["response"]["request_id"]
        body = x["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] >= 1
    assert b.usage is not None and b.usage.output_tokens == sum(
        x["response"]["body"]["usage"]["completion_tokens"] for x in out
    )
    assert b.id in [x.id for x in c.batches.list()]
    listed = {f.id: f.purpose for f in c.files.list()}
    assert listed[b.input_file_id] == "batch" and listed[b.output_file_id or ""] == "batch_output"
    assert server.metric("surge:batch_tokens_total") >= b.usage.output_tokens


def test_bad_lines_go_to_the_error_file_and_the_rest_run(server: ServerProcess) -> None:
    c = client(server.url)
    lines = [
        chat_line("good-1"),
        '{"custom_id": "broken", "method": "POST", "url": ',
        chat_line("unknown-url").replace(CHAT, "/v1/fine_tuning/jobs"),
        json.dumps({"custom_id": "other-endpoint", "method": "POST", "url": "/v1/completions",
                    "body": {"model": "test-model", "prompt": "x"}}),
        chat_line("no-such-model").replace('"test-model"', '"gpt-9"'),
        chat_line("good-2"),
    ]  # fmt: skip
    b = wait_done(c, submit(c, "\n".join(lines)).id)
    assert b.status == "completed"
    assert b.request_counts is not None
    counts = b.request_counts
    assert (counts.total, counts.completed, counts.failed) == (6, 2, 4)
    out, err = results(c, b)
    assert [x["custom_id"] for x in out] == ["good-1", "good-2"]
    codes = {x["custom_id"]: (x["error"] or {}).get("code") for x in err}
    assert codes == {None: "invalid_json", "unknown-url": "invalid_url",
                     "other-endpoint": "mismatched_endpoint", "no-such-model": None}  # fmt: skip
    model_404 = next(x for x in err if x["custom_id"] == "no-such-model")["response"]
    assert model_404["status_code"] == 404
    assert model_404["body"]["error"]["code"] == "model_not_found"
    assert b.errors is not None and [e.line for e in b.errors.data or []] == [2, 3, 4]


def test_a_batch_of_only_bad_lines_fails_with_every_line_in_the_error_file(
    server: ServerProcess,
) -> None:
    c = client(server.url)
    b = wait_done(c, submit(c, "\n".join(["[1]", "{}", '"x"'])).id)
    assert b.status == "failed" and b.failed_at
    assert len(results(c, b)[1]) == 3


@pytest.mark.parametrize(
    ("text", "status", "code", "named"),
    [
        ("\n".join(chat_line(f"r{i}", "x" * 1800) for i in range(40)), 413, "file_too_large",
         "--batch-max-file-bytes"),
        (chat_lines(101), 400, "too_many_lines", "--batch-max-lines"),
        (chat_line("long", "y" * 3000), 400, "line_too_large", "--batch-max-line-bytes"),
        ("", 400, "empty_file", "no lines"),
    ],
)  # fmt: skip
def test_an_upload_over_a_limit_is_refused_naming_the_limit(
    server: ServerProcess, text: str, status: int, code: str, named: str
) -> None:
    c = client(server.url)
    with pytest.raises(openai.APIStatusError) as e:
        c.files.create(file=("big.jsonl", text.encode()), purpose="batch")
    assert e.value.status_code == status
    assert isinstance(e.value.body, dict) and e.value.body["code"] == code
    assert named in e.value.message


def test_bad_batch_requests_get_clear_errors(server: ServerProcess) -> None:
    c = client(server.url)
    f = c.files.create(file=("in.jsonl", chat_line("a").encode()), purpose="batch")
    bad = [({"completion_window": "2 weeks"}, 400, "completion_window"),
           ({"endpoint": "/v1/moderations"}, 400, "endpoint"),
           ({"input_file_id": "file-nope"}, 404, "input_file_id"),
           ({"metadata": {"k": 5}}, 400, "metadata")]  # fmt: skip
    for change, status, param in bad:
        body = {"input_file_id": f.id, "endpoint": CHAT, "completion_window": "24h", **change}
        r = httpx.post(server.url + "/v1/batches", json=body,
                       headers={"authorization": f"Bearer {KEY_A}"})  # fmt: skip
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param
    r = httpx.post(server.url + "/v1/files", headers={"authorization": f"Bearer {KEY_A}"},
                   files={"file": ("x.jsonl", b"{}")}, data={"purpose": "fine-tune"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"


def test_another_key_sees_none_of_it(server: ServerProcess) -> None:
    a, b_ = client(server.url, KEY_A), client(server.url, KEY_B)
    batch = wait_done(a, submit(a, chat_lines(2)).id)
    mine = [batch.input_file_id, batch.output_file_id or ""]
    for fid in mine:
        with pytest.raises(openai.NotFoundError):
            b_.files.retrieve(fid)
        with pytest.raises(openai.NotFoundError):
            b_.files.content(fid)
        with pytest.raises(openai.NotFoundError):
            b_.files.delete(fid)
    with pytest.raises(openai.NotFoundError):
        b_.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        b_.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        b_.batches.create(input_file_id=batch.input_file_id, endpoint=CHAT,
                          completion_window="24h")  # fmt: skip
    assert not {f.id for f in b_.files.list()} & set(mine)
    assert batch.id not in [x.id for x in b_.batches.list()]
    assert a.files.retrieve(batch.input_file_id).id == batch.input_file_id  # still the owner's
    assert a.files.delete(batch.input_file_id).deleted


def test_cancel_puts_every_line_not_run_in_the_error_file(server: ServerProcess) -> None:
    c = client(server.url)
    b = submit(c, chat_lines(60, max_tokens=64, ignore_eos=True))
    wait_until(c, b.id, lambda x: x.status == "in_progress")
    assert _eventually(lambda: server.metric("surge:batch_window_seconds_left")) > 86000
    cancelled = c.batches.cancel(b.id)
    assert cancelled.status in ("cancelling", "cancelled")
    b = wait_done(c, b.id)
    assert b.status == "cancelled" and b.cancelling_at and b.cancelled_at
    assert_each_line_once(c, b, 60)
    err = results(c, b)[1]
    assert err and {x["error"]["code"] for x in err} == {"batch_cancelled"}
    assert server.metric("surge:batch_lines", state="pending") == 0


def test_pagination_of_batches(server: ServerProcess) -> None:
    c = client(server.url, KEY_B)
    ids = [submit(c, chat_line("p")).id for _ in range(3)]
    first = c.batches.list(limit=2)
    assert [x.id for x in first.data] == ids[::-1][:2] and first.has_more
    rest = c.batches.list(limit=2, after=first.data[-1].id)
    assert [x.id for x in rest.data] == ids[:1] and not rest.has_more
    for bid in ids:
        wait_done(c, bid)


def test_the_dashboard_state_and_surge_top_show_the_batch_api(server: ServerProcess) -> None:
    from rich.console import Console

    from surge.cli.top import View, render

    c = client(server.url)
    wait_done(c, submit(c, chat_lines(2)).id)
    auth = {"authorization": f"Bearer {KEY_A}"}
    state = httpx.get(server.url + "/v1/dashboard/state", headers=auth, timeout=10).json()
    batch = state["batch"]
    assert batch["available"] and batch["storage_ok"] and batch["tokens_total"] > 0
    assert set(batch["lines"]) == {"pending", "in_flight", "completed", "failed"}
    console = Console(record=True, width=200)
    console.print(render(state, server.url, View(), (1.0, 0.1)))
    assert re.search(r"batch: \d+ pending  \d+ in flight \(limit \d+\)", console.export_text())


def test_a_batch_past_its_window_expires_with_every_line_once(server: ServerProcess) -> None:
    c = client(server.url)
    # Far more work than 3 s holds, even for the tiny model on a fast CPU (40 lines of 64
    # tokens once finished inside the window in CI).
    b = submit(c, chat_lines(100, max_tokens=512, ignore_eos=True), window="3s")
    assert b.expires_at == b.created_at + 3
    b = wait_done(c, b.id)
    assert b.status == "expired" and b.expired_at
    assert_each_line_once(c, b, 100)
    err = results(c, b)[1]
    assert err and {x["error"]["code"] for x in err} == {"batch_expired"}


def _eventually(read: Callable[[], float], timeout_s: float = 10.0) -> float:
    """A gauge the runner sets on its next tick after a batch starts: read until it exists."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return read()
        except KeyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
