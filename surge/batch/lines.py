"""The runner's side of the store: claim pending lines, record each one's output exactly once,
put back the ones to run again, close what is left when a batch ends early, and write the
output and error files. Blocking calls on a Store, made on its thread (AsyncStore)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from surge.batch.records import ACTIVE, BatchRow, error_line, new_id
from surge.batch.store import StorageError, Store


@dataclass(frozen=True, slots=True)
class Claim:
    """One line taken to run: only this claim may record its output."""

    batch_id: str
    idx: int
    custom_id: str | None
    body: str
    attempts: int  # failed tries before this one
    endpoint: str
    owner: str
    auth: str | None
    expires_at: int


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def recover(store: Store) -> int:
    """After a restart: lines the last process had in flight run again (none had an output)."""
    with store._tx() as db:
        return db.execute("UPDATE lines SET state = 'pending' WHERE state = 'in_flight'").rowcount


def claim(store: Store, limit: int, now: float) -> list[Claim]:
    """Up to `limit` pending lines, due now, from in-progress batches whose window has not
    ended, the batch whose window ends first first (earliest deadline), in input order."""
    out: list[Claim] = []
    if limit <= 0:
        return out
    with store._tx() as db:
        batches = db.execute(
            "SELECT id, endpoint, owner, auth, expires_at FROM batches WHERE status = "
            "'in_progress' AND expires_at > ? ORDER BY expires_at, seq",
            (now,),
        ).fetchall()
        for bid, endpoint, owner, auth, expires_at in batches:
            rows = db.execute(
                "SELECT idx, custom_id, body, attempts FROM lines WHERE batch_id = ? AND "
                "state = 'pending' AND not_before <= ? ORDER BY idx LIMIT ?",
                (bid, now, limit - len(out)),
            ).fetchall()
            db.executemany(
                "UPDATE lines SET state = 'in_flight' WHERE batch_id = ? AND idx = ?",
                [(bid, r[0]) for r in rows],
            )
            out += [
                Claim(bid, idx, cid, body, attempts, endpoint, owner, auth, expires_at)
                for idx, cid, body, attempts in rows
            ]
            if len(out) >= limit:
                break
    return out


def record(store: Store, c: Claim, ok: bool, result: str, usage: Usage) -> bool:
    """The line's output (an output file line when `ok`, else an error file line) and its
    count, in one transaction; False when the claim no longer holds the line."""
    with store._tx() as db:
        done = db.execute(
            "UPDATE lines SET state = ?, ok = ?, result = ?, body = NULL WHERE batch_id = ? "
            "AND idx = ? AND state = 'in_flight'",
            ("completed" if ok else "failed", int(ok), result, c.batch_id, c.idx),
        ).rowcount
        if done:
            column = "completed" if ok else "failed"
            db.execute(
                f"UPDATE batches SET {column} = {column} + 1, prompt_tokens = prompt_tokens + ?, "
                "completion_tokens = completion_tokens + ?, cached_tokens = cached_tokens + ? "
                "WHERE id = ?",
                (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, c.batch_id),
            )
    return bool(done)


def release(store: Store, c: Claim, not_before: float, failed_try: bool) -> None:
    """Put a claimed line back to run again from `not_before` (a failed try counts)."""
    with store._tx() as db:
        db.execute(
            "UPDATE lines SET state = 'pending', not_before = ?, attempts = attempts + ? "
            "WHERE batch_id = ? AND idx = ? AND state = 'in_flight'",
            (not_before, int(failed_try), c.batch_id, c.idx),
        )


def close_open(store: Store, batch_id: str, code: str, message: str) -> int:
    """Every line of the batch not yet done goes to the error file with `code` (expired,
    cancelled); the count."""
    with store._tx() as db:
        rows = db.execute(
            "SELECT idx, custom_id FROM lines WHERE batch_id = ? AND state IN "
            "('pending', 'in_flight')",
            (batch_id,),
        ).fetchall()
        db.executemany(
            "UPDATE lines SET state = 'failed', ok = 0, result = ?, body = NULL "
            "WHERE batch_id = ? AND idx = ?",
            [(error_line(cid, code, message), batch_id, idx) for idx, cid in rows],
        )
        db.execute("UPDATE batches SET failed = failed + ? WHERE id = ?", (len(rows), batch_id))
    return len(rows)


def open_lines(store: Store, batch_id: str) -> int:
    (n,) = store.db.execute(
        "SELECT COUNT(*) FROM lines WHERE batch_id = ? AND state IN ('pending', 'in_flight')",
        (batch_id,),
    ).fetchone()
    return int(n)


def finalize(store: Store, batch_id: str, status: str, now: int) -> BatchRow:
    """Write the output file (answered 2xx) and the error file (the rest), one line per input
    line in input order, keep them as the batch owner's files, and end the batch in `status`
    (completed, expired or cancelled), all visible at once."""
    b = store.get_batch(None, batch_id)
    assert b is not None
    paths = {True: store.upload_path(), False: store.upload_path()}
    counts = {True: 0, False: 0}
    try:
        with (
            paths[True].open("w", encoding="utf-8") as out,
            paths[False].open("w", encoding="utf-8") as err,
        ):
            files = {True: out, False: err}
            rows = store.db.execute(
                "SELECT ok, result FROM lines WHERE batch_id = ? AND result "
                "IS NOT NULL ORDER BY idx",
                (batch_id,),
            )
            for ok, result in rows:
                files[bool(ok)].write(result + "\n")
                counts[bool(ok)] += 1
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
        ids = {
            kind: _keep(store, b, paths[kind], kind, now) if counts[kind] else None
            for kind in (True, False)
        }
    except OSError as e:
        raise StorageError(f"batch store: cannot write the results of {batch_id}: {e}") from e
    finally:
        for path in paths.values():
            path.unlink(missing_ok=True)
    with store._tx() as db:
        for kind, fid in ids.items():
            if fid is not None:
                db.execute(
                    "INSERT INTO files (id, owner, filename, purpose, bytes, created_at) "
                    "VALUES (?, ?, ?, 'batch_output', ?, ?)",
                    (
                        fid,
                        b.owner,
                        f"{batch_id}_{'output' if kind else 'error'}.jsonl",
                        store.file_path(fid).stat().st_size,
                        now,
                    ),
                )
        db.execute(
            "UPDATE batches SET output_file_id = ?, error_file_id = ?, auth = NULL WHERE id = ?",
            (ids[True], ids[False], batch_id),
        )
        store._set_status(db, batch_id, status, now)
    found = store.get_batch(None, batch_id)
    assert found is not None
    return found


def _keep(store: Store, b: BatchRow, src: Path, ok: bool, now: int) -> str:
    fid = new_id("file-")
    os.replace(src, store.file_path(fid))
    return fid


def line_counts(store: Store) -> dict[str, int]:
    """Lines of the batches not yet ended, by state (pending, in_flight, completed, failed)."""
    marks = ", ".join("?" * len(ACTIVE))
    rows = store.db.execute(
        f"SELECT l.state, COUNT(*) FROM lines l JOIN batches b ON b.id = l.batch_id "
        f"WHERE b.status IN ({marks}) GROUP BY l.state",
        ACTIVE,
    ).fetchall()
    counts = {"pending": 0, "in_flight": 0, "completed": 0, "failed": 0}
    counts.update({state: int(n) for state, n in rows})
    return counts
