"""Durable state of the Batch API: SQLite (WAL) plus the files' bytes, under one data folder.

    <data>/batch.db     files, batches, and one row per input line: its request, its state
                        (pending -> in_flight -> completed | failed) and its output line
    <data>/files/<id>   each file's bytes, written whole before its row exists
    <data>/lock         held (flock) while a process uses the folder: one process per folder

Exactly once: a line's output is written into its own row, in the same transaction that counts
it, and only by the claim that took it (state in_flight). A process killed mid-batch leaves
in_flight lines with no output; on restart `recover()` returns them to pending and they run
again, while lines already done keep their one output. The output and error files are written
from the rows at the end, one line per row, in input order.

Every method is blocking: the server and gateway call them on one thread of their own
(`AsyncStore`), never on the event loop. A data folder that cannot be written (read-only, disk
full) raises StorageError with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from surge.batch.records import ACTIVE, TIME_FIELDS, BatchRow, FileRow, new_id

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL,
    filename TEXT NOT NULL, purpose TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS files_by_owner ON files(owner, seq);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL,
    auth TEXT, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, times TEXT NOT NULL DEFAULT '{}', output_file_id TEXT,
    error_file_id TEXT, total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, metadata TEXT, errors TEXT NOT NULL DEFAULT '[]',
    prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0, invalid INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches(owner, seq);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches(status);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT, body TEXT,
    state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, not_before REAL NOT NULL DEFAULT 0,
    ok INTEGER, result TEXT, PRIMARY KEY (batch_id, idx)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS lines_by_state ON lines(batch_id, state, idx);
"""
MAX_ERRORS_SHOWN = 100  # validation errors listed on the batch object (all are in the file)


class StorageError(Exception):
    """The data folder cannot be used: not writable, disk full, or another process holds it."""


class Store:
    def __init__(self, root: Path, max_db_pages: int | None = None) -> None:
        """Open (or create) the folder. `max_db_pages`: SQLite's own cap on the database's size
        in pages (a quota; None: the disk is the limit)."""
        self.root = root
        self.files_dir = root / "files"
        self.tmp_dir = root / "tmp"
        self._lock_file: Any = None
        try:
            for d in (root, self.files_dir, self.tmp_dir):
                d.mkdir(parents=True, exist_ok=True, mode=0o700)  # holds API keys in flight
            self._lock()
            self.db = sqlite3.connect(
                root / "batch.db", check_same_thread=False, isolation_level=None
            )
            self.db.execute("PRAGMA journal_mode=WAL")
            # NORMAL: a commit survives the process being killed; only power loss may lose the
            # last ones (they run again).
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA busy_timeout=5000")
            if max_db_pages is not None:
                self.db.execute(f"PRAGMA max_page_count={int(max_db_pages)}")
            self.db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as e:
            self.close()
            raise StorageError(f"batch data folder {root} is not usable: {e}") from e
        for stale in self.tmp_dir.iterdir():  # half-written uploads of a killed process
            stale.unlink(missing_ok=True)

    def _lock(self) -> None:
        self._lock_file = open(self.root / "lock", "a+")  # noqa: SIM115 (held while open)
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StorageError(
                f"batch data folder {self.root} is in use by another process "
                "(give this one its own --data-dir)"
            ) from None

    def close(self) -> None:
        if getattr(self, "db", None) is not None:
            with contextlib.suppress(sqlite3.Error):
                self.db.close()
            self.db = None  # type: ignore[assignment]
        if self._lock_file is not None:
            self._lock_file.close()  # releases the flock
            self._lock_file = None

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction; a full disk or a read-only folder becomes StorageError."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                if self.db.in_transaction:  # SQLite rolls back itself on some errors (full)
                    self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as e:
            if self.db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
            raise StorageError(f"batch store: {e}") from e

    # ---- files -------------------------------------------------------------------------
    def upload_path(self) -> Path:
        """A fresh path under tmp/ for an upload being written."""
        return self.tmp_dir / new_id("upload-")

    def add_file(
        self, owner: str, filename: str, purpose: str, src: Path, nbytes: int, now: int
    ) -> FileRow:
        """Keep the fully written `src` as a new file (moved into files/)."""
        row = FileRow(new_id("file-"), owner, filename, purpose, nbytes, now)
        try:
            os.replace(src, self.files_dir / row.id)
        except OSError as e:
            raise StorageError(f"batch store: {e}") from e
        try:
            with self._tx() as db:
                db.execute(
                    "INSERT INTO files (id, owner, filename, purpose, bytes, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (row.id, owner, filename, purpose, nbytes, now),
                )
        except StorageError:
            (self.files_dir / row.id).unlink(missing_ok=True)
            raise
        return row

    def file_path(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def get_file(self, owner: str, file_id: str) -> FileRow | None:
        r = self.db.execute(
            "SELECT id, owner, filename, purpose, bytes, created_at FROM files "
            "WHERE id = ? AND owner = ?",
            (file_id, owner),
        ).fetchone()
        return FileRow(*r) if r else None

    def list_files(
        self,
        owner: str,
        after: str | None,
        limit: int,
        purpose: str | None,
        newest_first: bool = True,
    ) -> tuple[list[FileRow], bool]:
        op, order = ("<", "DESC") if newest_first else (">", "ASC")
        sql = "SELECT id, owner, filename, purpose, bytes, created_at FROM files WHERE owner = ?"
        args: list[Any] = [owner]
        if purpose is not None:
            sql += " AND purpose = ?"
            args.append(purpose)
        if after is not None:
            sql += f" AND seq {op} (SELECT seq FROM files WHERE id = ? AND owner = ?)"
            args += [after, owner]
        rows = self.db.execute(f"{sql} ORDER BY seq {order} LIMIT ?", (*args, limit + 1))
        found = [FileRow(*r) for r in rows]
        return found[:limit], len(found) > limit

    def owner_usage(self, owner: str) -> tuple[int, int]:
        """(files, bytes) an owner keeps."""
        n, total = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM files WHERE owner = ?", (owner,)
        ).fetchone()
        return int(n), int(total)

    def delete_file(self, owner: str, file_id: str) -> bool:
        with self._tx() as db:
            gone = db.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner))
        if gone.rowcount:
            (self.files_dir / file_id).unlink(missing_ok=True)
        return bool(gone.rowcount)

    def sweep_orphans(self) -> int:
        """Delete files/ entries without a row (written by a process killed before its row)."""
        known = {r[0] for r in self.db.execute("SELECT id FROM files")}
        removed = 0
        for path in self.files_dir.iterdir():
            if path.name not in known:
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    # ---- batches -----------------------------------------------------------------------
    _BATCH_COLUMNS = (
        "id, owner, endpoint, input_file_id, completion_window, status, "
        "created_at, expires_at, times, output_file_id, error_file_id, total, "
        "completed, failed, metadata, errors, prompt_tokens, completion_tokens, "
        "cached_tokens, invalid"
    )

    @staticmethod
    def _batch(r: tuple[Any, ...]) -> BatchRow:
        bid, owner, endpoint, input_file_id, window, status, created, expires = r[:8]
        times, out, err, total, completed, failed, metadata, errors = r[8:16]
        prompt, completion, cached, invalid = r[16:]
        return BatchRow(
            bid, owner, endpoint, input_file_id, window, status, created, expires,
            json.loads(times), out, err, total, completed, failed,
            json.loads(metadata) if metadata else None, json.loads(errors), prompt, completion,
            cached, invalid,
        )  # fmt: skip

    def create_batch(
        self,
        owner: str,
        auth: str | None,
        endpoint: str,
        input_file_id: str,
        window: str,
        window_s: int,
        metadata: dict[str, str] | None,
        now: int,
    ) -> BatchRow:
        bid = new_id("batch_")
        with self._tx() as db:
            db.execute(
                "INSERT INTO batches (id, owner, auth, endpoint, input_file_id, "
                "completion_window, status, created_at, expires_at, metadata) "
                "VALUES (?, ?, ?, ?, ?, ?, 'validating', ?, ?, ?)",
                (
                    bid,
                    owner,
                    auth,
                    endpoint,
                    input_file_id,
                    window,
                    now,
                    now + window_s,
                    json.dumps(metadata) if metadata is not None else None,
                ),
            )
        found = self.get_batch(owner, bid)
        assert found is not None
        return found

    def get_batch(self, owner: str | None, batch_id: str) -> BatchRow | None:
        """The batch, if `owner` owns it (None: whoever does)."""
        sql = f"SELECT {self._BATCH_COLUMNS} FROM batches WHERE id = ?"
        args: tuple[Any, ...] = (batch_id,)
        if owner is not None:
            sql, args = sql + " AND owner = ?", (batch_id, owner)
        r = self.db.execute(sql, args).fetchone()
        return self._batch(r) if r else None

    def list_batches(
        self, owner: str, after: str | None, limit: int
    ) -> tuple[list[BatchRow], bool]:
        sql = f"SELECT {self._BATCH_COLUMNS} FROM batches WHERE owner = ?"
        args: list[Any] = [owner]
        if after is not None:
            sql += " AND seq < (SELECT seq FROM batches WHERE id = ? AND owner = ?)"
            args += [after, owner]
        rows = self.db.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit + 1))
        found = [self._batch(r) for r in rows]
        return found[:limit], len(found) > limit

    def batches_in(self, statuses: tuple[str, ...]) -> list[BatchRow]:
        """Batches in these statuses, the one whose window ends first first (then oldest)."""
        marks = ", ".join("?" * len(statuses))
        rows = self.db.execute(
            f"SELECT {self._BATCH_COLUMNS} FROM batches WHERE status IN "
            f"({marks}) ORDER BY expires_at, seq",
            statuses,
        )
        return [self._batch(r) for r in rows]

    def count_active(self, owner: str) -> int:
        marks = ", ".join("?" * len(ACTIVE))
        (n,) = self.db.execute(
            f"SELECT COUNT(*) FROM batches WHERE owner = ? AND status IN ({marks})",
            (owner, *ACTIVE),
        ).fetchone()
        return int(n)

    def batch_auth(self, batch_id: str) -> str | None:
        """The Authorization its lines are sent with (the creator's own), while it runs."""
        r = self.db.execute("SELECT auth FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return r[0] if r else None

    def set_status(
        self,
        batch_id: str,
        status: str,
        now: int,
        only_from: tuple[str, ...] = (),
        errors: list[dict[str, Any]] | None = None,
    ) -> bool:
        """Move a batch to `status` (stamping `<status>_at`), only from `only_from` if given."""
        with self._tx() as db:
            return self._set_status(db, batch_id, status, now, only_from, errors)

    def _set_status(
        self,
        db: sqlite3.Connection,
        batch_id: str,
        status: str,
        now: int,
        only_from: tuple[str, ...] = (),
        errors: list[dict[str, Any]] | None = None,
    ) -> bool:
        r = db.execute("SELECT status, times FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if r is None or (only_from and r[0] not in only_from):
            return False
        times = json.loads(r[1])
        if f"{status}_at" in TIME_FIELDS:
            times[f"{status}_at"] = now
        sql, args = "UPDATE batches SET status = ?, times = ?", [status, json.dumps(times)]
        if errors is not None:
            sql, args = sql + ", errors = ?", [*args, json.dumps(errors[:MAX_ERRORS_SHOWN])]
        db.execute(sql + " WHERE id = ?", (*args, batch_id))
        return True

    def set_lines(
        self,
        batch_id: str,
        rows: list[tuple[int, str | None, str | None, str | None]],
        errors: list[dict[str, Any]],
        now: int,
    ) -> BatchRow:
        """A validated batch's lines, (idx, custom_id, body, error line or None each), and its
        move to in_progress."""
        runnable = sum(1 for r in rows if r[3] is None)
        with self._tx() as db:
            db.executemany(
                "INSERT OR REPLACE INTO lines (batch_id, idx, custom_id, body, state, ok, result) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        batch_id,
                        idx,
                        cid,
                        body,
                        "pending" if err is None else "failed",
                        None if err is None else 0,
                        err,
                    )
                    for idx, cid, body, err in rows
                ],
            )
            invalid = len(rows) - runnable
            db.execute(
                "UPDATE batches SET total = ?, failed = ?, invalid = ? WHERE id = ?",
                (len(rows), invalid, invalid, batch_id),
            )
            # With no line to run it ends at once (the runner writes the error file): failed.
            self._set_status(db, batch_id, "in_progress", now, ("validating",), errors)
        found = self.get_batch(None, batch_id)
        assert found is not None
        return found

    def fail_batch(self, batch_id: str, code: str, message: str, now: int) -> None:
        """A batch that cannot start at all (its input file gone or unreadable)."""
        errors = [{"code": code, "message": message, "line": None, "param": None}]
        self.set_status(batch_id, "failed", now, ("validating",), errors)
        with self._tx() as db:
            db.execute("UPDATE batches SET auth = NULL WHERE id = ?", (batch_id,))

    def request_cancel(self, owner: str, batch_id: str, now: int) -> BatchRow | None:
        """Cancel a batch that has not ended (it goes through cancelling); None: not the
        owner's. A batch already ended is returned as it is."""
        if self.get_batch(owner, batch_id) is None:
            return None
        self.set_status(batch_id, "cancelling", now, ("validating", "in_progress"))
        return self.get_batch(owner, batch_id)


class AsyncStore:
    """The store on a thread of its own: one connection, calls in order, the loop never waits
    on SQLite or the disk."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="surge-batch-db")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def close(self) -> None:
        await self.call(self.store.close)
        self._pool.shutdown(wait=False)
