"""What a batch input file may hold: the upload's limits (checked as its bytes arrive) and each
line's shape (checked when a batch is created from it).

A file over a limit is refused whole at upload, with the limit named (file bytes, lines, line
bytes). A line that is not a request the batch can send (malformed JSON, an unknown URL, another
endpoint than the batch's, a stream) goes to the error file with its reason, and the other lines
run: a bad line never fails the batch."""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from typing import Any

from surge.batch.config import ENDPOINTS, BatchConfig
from surge.http.unicode_check import lone_surrogate


class UploadRejected(ValueError):
    """A file the Batch API will not keep; `code` names the limit or the fault."""

    def __init__(self, message: str, code: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class UploadCheck:
    """Fed the upload's bytes in order: counts them, its lines and the longest line, and
    refuses (UploadRejected) as soon as one goes over its limit or the text is not UTF-8."""

    def __init__(self, config: BatchConfig) -> None:
        self.config = config
        self.bytes = 0
        self.lines = 0  # non-blank lines
        self._line_bytes = 0  # of the line being read
        self._line_blank = True
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def feed(self, chunk: bytes) -> None:
        c = self.config
        self.bytes += len(chunk)
        if self.bytes > c.max_file_bytes:
            raise UploadRejected(
                f"file is larger than the limit of {c.max_file_bytes} bytes (file bytes: "
                "--batch-max-file-bytes); split it into several batches",
                "file_too_large",
                status=413,
            )
        try:
            self._decoder.decode(chunk)
        except UnicodeDecodeError as e:
            raise UploadRejected(
                f"file is not UTF-8 text near byte {self.bytes - len(chunk) + e.start}",
                "invalid_encoding",
            ) from None
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            part = chunk[start:] if end < 0 else chunk[start:end]
            self._line_bytes += len(part)
            if self._line_blank and part.strip():
                self._line_blank = False
            if self._line_bytes > c.max_line_bytes:
                raise UploadRejected(
                    f"line {self.lines + 1} is longer than the limit of {c.max_line_bytes} "
                    "bytes (line bytes: --batch-max-line-bytes)",
                    "line_too_large",
                )
            if end < 0:
                return
            self._end_line()
            start = end + 1

    def finish(self) -> None:
        """The upload is complete: its last line counts, and it must hold at least one."""
        try:
            self._decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise UploadRejected("file ends inside a UTF-8 character", "invalid_encoding") from None
        self._end_line()
        if self.lines == 0:
            raise UploadRejected(
                "file holds no lines: a batch input file is JSONL, one request per line",
                "empty_file",
            )

    def _end_line(self) -> None:
        if not self._line_blank:
            self.lines += 1
            if self.lines > self.config.max_lines:
                raise UploadRejected(
                    f"file has more than the limit of {self.config.max_lines} lines (lines: "
                    "--batch-max-lines); split it into several batches",
                    "too_many_lines",
                )
        self._line_bytes = 0
        self._line_blank = True


@dataclass(frozen=True, slots=True)
class Line:
    """One input line as the batch will run it, or why it cannot."""

    number: int  # 1-based line number in the file
    custom_id: str | None
    body: str | None  # the request body, JSON
    code: str | None = None  # set when the line is refused
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.code is None


def parse_line(text: str, number: int, endpoint: str) -> Line:
    """One line of the input file against the batch's `endpoint` (OpenAI's request shape:
    custom_id, method POST, url, body)."""
    try:
        obj: Any = json.loads(text)
    except ValueError as e:
        return Line(number, None, None, "invalid_json", f"line {number} is not valid JSON: {e}")
    if not isinstance(obj, dict):
        return Line(number, None, None, "invalid_json", f"line {number} is not a JSON object")
    custom_id = obj.get("custom_id")
    cid = custom_id if isinstance(custom_id, str) else None

    def bad(code: str, message: str) -> Line:
        return Line(number, cid, None, code, f"line {number}: {message}")

    if lone_surrogate(obj):
        return bad("invalid_unicode", "a string holds a lone UTF-16 surrogate escape")
    if cid is None or not cid:
        return bad("missing_custom_id", "custom_id must be a non-empty string")
    method = obj.get("method", "POST")
    if not isinstance(method, str) or method.upper() != "POST":
        return bad("invalid_method", f"method must be POST, got {method!r}")
    url = obj.get("url")
    if not isinstance(url, str) or url not in ENDPOINTS:
        return bad(
            "invalid_url", f"unknown url {url!r}; a batch line may call {', '.join(ENDPOINTS)}"
        )
    if url != endpoint:
        return bad("mismatched_endpoint", f"url {url!r} is not the batch's endpoint {endpoint!r}")
    body = obj.get("body")
    if not isinstance(body, dict):
        return bad("invalid_body", "body must be a JSON object (the request's parameters)")
    if body.get("stream") is True:
        return bad("stream_not_supported", "a batch line cannot stream; drop 'stream'")
    return Line(number, cid, json.dumps(body, ensure_ascii=False))


def parse_lines(raw: bytes, endpoint: str) -> list[Line]:
    """Every non-blank line of an uploaded file, parsed; a custom_id seen before is refused."""
    seen: set[str] = set()
    out: list[Line] = []
    for number, text in enumerate(raw.decode("utf-8").split("\n"), start=1):
        if not text.strip():
            continue
        line = parse_line(text, number, endpoint)
        if line.ok and line.custom_id in seen:
            line = Line(
                number,
                line.custom_id,
                None,
                "duplicate_custom_id",
                f"line {number}: custom_id {line.custom_id!r} appears on an earlier line",
            )
        if line.custom_id is not None:
            seen.add(line.custom_id)
        out.append(line)
    return out
