"""BatchConfig: the Batch API's limits, data folder and pace, one frozen part of the server's
and the gateway's configs (their `surge serve` / `surge gateway` flags come from its fields)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from surge.config.flags import flag
from surge.config.settings import settings

MIB = 1024 * 1024
# Marks a request as a batch line (the runner sets it): the server runs it at BATCH_PRIORITY,
# the lowest there is, outside the interactive admission and queue-wait bounds, in a pool of
# its own. A client that sets it gains nothing: its request only goes last.
BATCH_LINE_HEADER = "x-surge-batch-line"
BATCH_PRIORITY = 2**31 - 1
# The endpoints a batch line may call (OpenAI's, those Surge serves).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
_WINDOW = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_WINDOW_S = 1
MAX_WINDOW_S = 7 * 86400


def parse_window(text: str) -> int:
    """A completion window in seconds: OpenAI's "24h", and (a Surge extension) any shorter or
    longer one in s, m, h or d, from 1 s to 7 days. ValueError names what is accepted."""
    m = _WINDOW.match(text)
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)] if m else 0
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise ValueError(
            f"completion_window must be a duration such as '24h', '1h', '10m' or '90s' "
            f"(from 1s to 7d), got {text!r}"
        )
    return seconds


def default_data_dir(kind: str, port: int) -> Path:
    """$XDG_STATE_HOME/surge/batch/<kind>-<port> (else ~/.local/state/...): one folder per
    process, so that servers and a gateway on one host keep their batches apart."""
    return settings().state_home / "surge" / "batch" / f"{kind}-{port}"


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """The Batch API (/v1/files, /v1/batches): where it keeps its state, what it accepts, and
    how hard it may push the engine (lines in flight, retries)."""

    enabled: bool = field(
        default=True,
        metadata=flag(
            "turn the Batch API (/v1/files, /v1/batches) off", name="no-batch-api", negate=True
        ),
    )
    # Files and batch state (SQLite + the files' bytes). None: default_data_dir(kind, port).
    data_dir: str | None = field(
        default=None,
        metadata=flag(
            "the Batch API's files and state (SQLite), kept across restarts (default: "
            "$XDG_STATE_HOME/surge/batch/<serve|gateway>-<port>, else under ~/.local/state)",
            name="data-dir",
        ),
    )
    # Upload limits, each named in the error that refuses a file (OpenAI: 200 MB, 50,000 lines).
    max_file_bytes: int = field(
        default=200 * MIB,
        metadata=flag("largest file accepted by POST /v1/files", name="batch-max-file-bytes"),
    )
    max_lines: int = field(
        default=50_000,
        metadata=flag("most lines (requests) in a batch input file", name="batch-max-lines"),
    )
    max_line_bytes: int = field(
        default=1 * MIB,
        metadata=flag("longest line of a batch input file", name="batch-max-line-bytes"),
    )
    # Per API key (tenant): what it may keep and run at once.
    max_files_per_key: int = field(
        default=1000, metadata=flag("files one API key may keep", name="batch-max-files-per-key")
    )
    max_bytes_per_key: int = field(
        default=10 * 1024 * MIB,
        metadata=flag("bytes of files one API key may keep", name="batch-max-bytes-per-key"),
    )
    max_batches_per_key: int = field(
        default=16,
        metadata=flag(
            "batches one API key may have in flight (not yet completed, failed, expired or "
            "cancelled)",
            name="batch-max-batches-per-key",
        ),
    )
    # Lines in flight at once, from every batch: on a server, in its engine (halved while
    # interactive requests wait for a first token, grown back by one a tick when none do); on
    # a gateway, per upstream in rotation.
    max_concurrency: int = field(
        default=64,
        metadata=flag(
            "batch lines in flight at once (per upstream on a gateway); fewer while interactive "
            "requests wait",
            name="batch-max-concurrency",
        ),
    )
    min_concurrency: int = 1
    # A line that fails for the server's sake (5xx, timeout, a replica gone) runs again, up to
    # this many tries in all; refusals (429/503) wait and do not count.
    max_attempts: int = field(
        default=3,
        metadata=flag(
            "tries of a batch line that fails with a server error before it goes to the error file",
            name="batch-max-attempts",
        ),
    )
    line_timeout_s: float = 600.0  # one line's request timeout (less when the window ends first)
    retry_backoff_s: float = 1.0  # first wait after a refusal or failure, doubled up to 30 s

    def __post_init__(self) -> None:
        for name in (
            "max_file_bytes",
            "max_lines",
            "max_line_bytes",
            "max_files_per_key",
            "max_bytes_per_key",
            "max_batches_per_key",
            "max_concurrency",
            "min_concurrency",
            "max_attempts",
        ):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"batch {name} must be >= 1, got {value}")
        if self.min_concurrency > self.max_concurrency:
            raise ValueError("batch min_concurrency must be <= max_concurrency")
        if self.line_timeout_s <= 0 or self.retry_backoff_s <= 0:
            raise ValueError("batch line_timeout_s and retry_backoff_s must be > 0")

    def data_path(self, kind: str, port: int) -> Path:
        return Path(self.data_dir) if self.data_dir else default_data_dir(kind, port)
