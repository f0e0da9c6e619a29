"""The store on a real SQLite file: every line's output exactly once across a kill and a restart,
one process per data folder, and a full or unwritable folder as a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surge.batch import lines as L
from surge.batch.records import error_line, response_line
from surge.batch.store import StorageError, Store
from surge.batch.validate import parse_lines

ENDPOINT = "/v1/chat/completions"


def _batch(store: Store, n: int, owner: str = "alice") -> str:
    text = "\n".join(
        json.dumps({"custom_id": f"r{i}", "method": "POST", "url": ENDPOINT,
                    "body": {"messages": [{"role": "user", "content": str(i)}]}})
        for i in range(n)
    ).encode()  # fmt: skip
    src = store.upload_path()
    src.write_bytes(text)
    f = store.add_file(owner, "in.jsonl", "batch", src, len(text), 0)
    b = store.create_batch(owner, "Bearer k", ENDPOINT, f.id, "24h", 86400, None, 0)
    parsed = parse_lines(text, ENDPOINT)
    store.set_lines(b.id, [(i, ln.custom_id, ln.body, None) for i, ln in enumerate(parsed)], [], 0)
    return b.id


def _answer(store: Store, c: L.Claim) -> bool:
    return L.record(store, c, True, response_line(c.custom_id, 200, "req", {"ok": c.idx}),
                    L.Usage(3, 5))  # fmt: skip


def _output_ids(store: Store, file_id: str | None) -> list[str]:
    if file_id is None:
        return []
    text = store.file_path(file_id).read_text()
    return [json.loads(line)["custom_id"] for line in text.splitlines()]


def test_a_kill_mid_batch_loses_no_line_and_runs_none_twice(tmp_path: Path) -> None:
    store = Store(tmp_path)
    bid = _batch(store, 10)
    first = L.claim(store, 6, now=1.0)
    assert [c.idx for c in first] == [0, 1, 2, 3, 4, 5]
    for c in first[:4]:
        assert _answer(store, c)
    store.close()  # the process dies with lines 4 and 5 in flight (no output recorded)

    store = Store(tmp_path)
    assert L.recover(store) == 2
    assert not _answer(store, first[4])  # a stale claim records nothing
    rest = L.claim(store, 100, now=2.0)
    assert [c.idx for c in rest] == [4, 5, 6, 7, 8, 9]
    L.release(store, rest[0], not_before=50.0, failed_try=True)  # to run again, later
    for c in rest[1:]:
        assert _answer(store, c)
    assert L.claim(store, 10, now=3.0) == []  # not due yet
    again = L.claim(store, 10, now=60.0)
    assert [(c.idx, c.attempts) for c in again] == [(4, 1)]
    assert _answer(store, again[0])
    assert L.open_lines(store, bid) == 0

    done = L.finalize(store, bid, "completed", 100)
    assert done.status == "completed" and done.times["completed_at"] == 100
    assert (done.total, done.completed, done.failed) == (10, 10, 0)
    assert (done.prompt_tokens, done.completion_tokens) == (30, 50)
    assert _output_ids(store, done.output_file_id) == [f"r{i}" for i in range(10)]
    assert done.error_file_id is None
    out = store.get_file("alice", done.output_file_id or "")
    assert out is not None and out.purpose == "batch_output"


def test_a_batch_ended_early_puts_every_line_not_run_in_the_error_file(tmp_path: Path) -> None:
    store = Store(tmp_path)
    bid = _batch(store, 5)
    claimed = L.claim(store, 2, now=1.0)
    _answer(store, claimed[0])
    assert L.close_open(store, bid, "batch_expired", "window ended") == 4
    done = L.finalize(store, bid, "expired", 9)
    assert (done.status, done.completed, done.failed) == ("expired", 1, 4)
    assert _output_ids(store, done.output_file_id) == ["r0"]
    errors = [
        json.loads(x)
        for x in store.file_path(done.error_file_id or "").read_text().split("\n")
        if x
    ]
    assert [e["custom_id"] for e in errors] == ["r1", "r2", "r3", "r4"]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_files_and_batches_belong_to_their_owner(tmp_path: Path) -> None:
    store = Store(tmp_path)
    bid = _batch(store, 1, owner="alice")
    b = store.get_batch("alice", bid)
    assert b is not None
    assert store.get_batch("bob", bid) is None
    assert store.get_file("bob", b.input_file_id) is None
    assert store.list_files("bob", None, 10, None) == ([], False)
    assert store.list_batches("bob", None, 10) == ([], False)
    assert not store.delete_file("bob", b.input_file_id)
    assert store.request_cancel("bob", bid, 1) is None
    assert store.owner_usage("alice")[0] == 1 and store.owner_usage("bob") == (0, 0)


def test_lists_page_with_after_and_limit(tmp_path: Path) -> None:
    store = Store(tmp_path)
    ids = [_batch(store, 1) for _ in range(5)]
    page, more = store.list_batches("alice", None, 2)
    assert [b.id for b in page] == ids[::-1][:2] and more
    page, more = store.list_batches("alice", page[-1].id, 10)
    assert [b.id for b in page] == ids[::-1][2:] and not more


def test_one_process_per_data_folder(tmp_path: Path) -> None:
    store = Store(tmp_path)
    with pytest.raises(StorageError, match="in use by another process"):
        Store(tmp_path)
    store.close()
    Store(tmp_path).close()  # free again once the first has closed


def test_an_unusable_folder_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(StorageError, match="not usable"):
        Store(blocker / "data")


def test_a_full_store_refuses_writes_with_a_storage_error_and_keeps_reading(tmp_path: Path) -> None:
    store = Store(tmp_path, max_db_pages=40)  # SQLite's own size cap: "database or disk is full"
    bid = _batch(store, 2)
    with pytest.raises(StorageError, match="full"):
        big = [(i, f"x{i}", "y" * 4000, None) for i in range(2, 200)]
        store.set_lines(bid, big, [], 1)
    assert store.get_batch(None, bid) is not None  # reads still work
    claimed = L.claim(store, 1, now=1.0)
    assert claimed and L.record(store, claimed[0], False, error_line("r0", "c", "m"), L.Usage())
