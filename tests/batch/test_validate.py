"""Upload limits (checked as the bytes arrive) and each line's checks, on plain data."""

from __future__ import annotations

import json

import pytest

from surge.batch.config import BatchConfig, parse_window
from surge.batch.throttle import Throttle
from surge.batch.validate import UploadCheck, UploadRejected, parse_lines


def _line(cid: str, url: str = "/v1/chat/completions", **body: object) -> str:
    body = body or {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def _check(data: bytes, config: BatchConfig, chunk: int = 7) -> UploadCheck:
    check = UploadCheck(config)
    for i in range(0, len(data), chunk):
        check.feed(data[i : i + chunk])
    check.finish()
    return check


def test_an_upload_within_the_limits_is_counted() -> None:
    data = ("\n".join(_line(f"r{i}") for i in range(3)) + "\n\n").encode()
    check = _check(data, BatchConfig())
    assert (check.lines, check.bytes) == (3, len(data))


@pytest.mark.parametrize(
    ("config", "data", "code", "named"),
    [
        (BatchConfig(max_file_bytes=100), b"x" * 101, "file_too_large", "--batch-max-file-bytes"),
        (BatchConfig(max_lines=2), b"a\nb\nc\n", "too_many_lines", "--batch-max-lines"),
        (BatchConfig(max_line_bytes=4), b"ok\n12345\n", "line_too_large", "--batch-max-line-bytes"),
        (BatchConfig(), b"\n \n", "empty_file", "no lines"),
        (BatchConfig(), b"ok\n\xff\xfe\n", "invalid_encoding", "UTF-8"),
    ],
)
def test_an_upload_over_a_limit_is_refused_with_the_limit_named(
    config: BatchConfig, data: bytes, code: str, named: str
) -> None:
    with pytest.raises(UploadRejected) as e:
        _check(data, config, chunk=3)
    assert e.value.code == code
    assert named in str(e.value)
    if code == "line_too_large":
        assert "line 2" in str(e.value)


def test_bad_lines_are_refused_one_by_one_and_the_rest_kept() -> None:
    text = "\n".join([
        _line("ok-1"),
        "{not json",
        _line("bad-url", url="/v1/images/generations"),
        _line("other-endpoint", url="/v1/completions", model="m", prompt="x"),
        _line("ok-1"),  # a custom_id seen before
        json.dumps({"custom_id": "no-body", "method": "POST", "url": "/v1/chat/completions"}),
        _line("streams", model="m", messages=[], stream=True),
        json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}}),
        _line("ok-2"),
    ])  # fmt: skip
    lines = parse_lines(text.encode(), "/v1/chat/completions")
    codes = [ln.code for ln in lines]
    assert codes == [None, "invalid_json", "invalid_url", "mismatched_endpoint",
                     "duplicate_custom_id", "invalid_body", "stream_not_supported",
                     "missing_custom_id", None]  # fmt: skip
    assert [ln.number for ln in lines] == list(range(1, 10))
    assert lines[2].custom_id == "bad-url"  # kept for the error file
    assert json.loads(lines[0].body or "")["messages"][0]["content"] == "hi"


def test_completion_windows() -> None:
    assert parse_window("24h") == 86400
    assert parse_window("10m") == 600
    assert parse_window("90s") == 90
    for bad in ("", "24", "0h", "8d", "1w", "h1"):
        with pytest.raises(ValueError, match="completion_window"):
            parse_window(bad)


def test_throttle_halves_while_interactive_work_waits_and_grows_back_by_one() -> None:
    t = Throttle(1, 16, cooldown_s=0.5)
    assert t.update(0, 0.0) == 16
    assert t.update(3, 1.0) == 8
    assert t.update(3, 1.2) == 8  # within the cooldown: one cut
    assert t.update(3, 1.6) == 4
    assert [t.update(0, 2.0 + i) for i in range(3)] == [5, 6, 7]
    for i in range(10):
        t.update(5, 10.0 + i)
    assert t.limit == 1
    assert t.update(0, 30.0, high=4) == 2 and t.update(0, 31.0, high=1) == 1
