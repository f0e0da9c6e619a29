"""Batch API helpers for the tests: input files, waiting for a batch, reading its results."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
from openai.types import Batch

CHAT = "/v1/chat/completions"
KEY_A, KEY_B = "sk-batch-a", "sk-batch-b"
DONE = ("completed", "failed", "expired", "cancelled")
# Test servers: no start-up step-cost measurement (seconds of each start; the first steps price
# them), two API keys.
QUICK = ("--dtype", "float32", "--calibration", "off")
KEYS = ("--api-key", KEY_A, "--api-key", KEY_B)


def chat_line(cid: str, content: str = "Hi", max_tokens: int = 8, **extra: Any) -> str:
    body = {"model": "test-model", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, **extra}  # fmt: skip
    return json.dumps({"custom_id": cid, "method": "POST", "url": CHAT, "body": body})


def chat_lines(n: int, prefix: str = "r", **kw: Any) -> str:
    return "\n".join(chat_line(f"{prefix}{i}", content=f"Count to {i}.", **kw) for i in range(n))


def client(url: str, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def submit(c: openai.OpenAI, text: str, window: str = "24h", endpoint: str = CHAT) -> Batch:
    f = c.files.create(file=("input.jsonl", text.encode()), purpose="batch")
    return c.batches.create(input_file_id=f.id, endpoint=endpoint,  # type: ignore[arg-type]
                            completion_window=window)  # type: ignore[arg-type]  # fmt: skip


def wait_until(c: openai.OpenAI, batch_id: str, ok: Any, timeout_s: float = 60.0) -> Batch:
    """Poll until `ok(batch)`; the batch."""
    deadline = time.monotonic() + timeout_s
    while True:
        b = c.batches.retrieve(batch_id)
        if ok(b):
            return b
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} still {b.status}: {b.request_counts}")
        time.sleep(0.2)


def completed(b: Batch) -> int:
    return b.request_counts.completed if b.request_counts is not None else 0


def wait_done(c: openai.OpenAI, batch_id: str, timeout_s: float = 60.0) -> Batch:
    return wait_until(c, batch_id, lambda b: b.status in DONE, timeout_s)


def jsonl(c: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in c.files.content(file_id).text.splitlines() if line]


def results(c: openai.OpenAI, b: Batch) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(output file lines, error file lines)."""
    return jsonl(c, b.output_file_id), jsonl(c, b.error_file_id)


def assert_each_line_once(c: openai.OpenAI, b: Batch, n: int, prefix: str = "r") -> None:
    """Every input line in the output or the error file, exactly once."""
    out, err = results(c, b)
    ids = [x["custom_id"] for x in out + err]
    assert sorted(ids) == sorted(f"{prefix}{i}" for i in range(n)), ids
    assert b.request_counts is not None
    assert b.request_counts.total == n
    assert (b.request_counts.completed, b.request_counts.failed) == (len(out), len(err))
