"""One streamed request against an OpenAI-compatible server, recorded with raw timestamps.

Every time in a record is seconds from the run's start on `time.perf_counter()`. A chunk counts
(`chunk_s`) when it carries generated text; the chat API's opening role-only chunk does not.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

import httpx

from surge.bench.config import BenchConfig
from surge.bench.workload import Prompt


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """An API request ready to send, and the prompt it came from."""

    path: str
    body: dict[str, object]
    headers: tuple[tuple[str, str], ...]
    prompt: Prompt


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request. Filled in while it streams; plain data afterwards."""

    index: int
    max_tokens: int
    tenant: str | None = None
    priority: int | None = None
    group: int | None = None
    input_len: int | None = None  # prompt tokens asked for
    scheduled_s: float | None = None  # open loop: when the arrival process wanted it sent
    send_s: float | None = None  # None: never sent (cancelled while waiting for a slot)
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk with text
    chunk_tokens: list[int] | None = None  # tokens in each chunk, where knowable
    done_s: float | None = None
    status: int | None = None
    error: str | None = None
    error_type: str | None = None  # http_<status>, stream_error, timeout, or the exception name
    cancelled: bool = False  # cut off by the end of the run: not an error
    num_prompt_tokens: int | None = None  # the server's usage from here on
    num_output_tokens: int | None = None
    num_cached_tokens: int | None = None
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error_type is None and not self.cancelled

    @property
    def ttft_s(self) -> float | None:
        if self.send_s is None or not self.chunk_s:
            return None
        return self.chunk_s[0] - self.send_s

    @property
    def e2e_s(self) -> float | None:
        if self.send_s is None or self.done_s is None:
            return None
        return self.done_s - self.send_s

    @property
    def output_tokens(self) -> int:
        """The server's count when it reported usage, else the number of text chunks."""
        if self.num_output_tokens is not None:
            return self.num_output_tokens
        return len(self.chunk_s)

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (output tokens - 1): the mean time per token after the first."""
        ttft, e2e, n = self.ttft_s, self.e2e_s, self.output_tokens
        if ttft is None or e2e is None or n < 2:
            return None
        return (e2e - ttft) / (n - 1)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive text chunks."""
        return [b - a for a, b in itertools.pairwise(self.chunk_s)]

    @property
    def lateness_s(self) -> float | None:
        if self.scheduled_s is None or self.send_s is None:
            return None
        return self.send_s - self.scheduled_s


def new_record(prompt: Prompt, scheduled_s: float | None = None) -> RequestRecord:
    return RequestRecord(
        index=prompt.index,
        max_tokens=prompt.max_tokens,
        tenant=prompt.tenant,
        priority=prompt.priority,
        group=prompt.group,
        input_len=prompt.input_len,
        scheduled_s=scheduled_s,
    )


def build_request(prompt: Prompt, config: BenchConfig) -> BenchRequest:
    """The body for `config.api`. Tenant goes as `user` and `x-surge-tenant`, priority as vLLM's
    `priority` field and `x-surge-priority`; both only when set (vLLM rejects a priority unless
    it was started with priority scheduling)."""
    if config.api == "embeddings":
        return _embedding_request(prompt, config)
    stream_options: dict[str, object] = {"include_usage": True}
    if config.continuous_usage:
        stream_options["continuous_usage_stats"] = True
    body: dict[str, object] = {
        "model": config.model,
        "max_tokens": prompt.max_tokens,
        "stream": True,
        "stream_options": stream_options,
    }
    if config.api == "chat":
        messages = [{"role": "user", "content": prompt.text.lstrip()}]
        if prompt.system:
            messages.insert(0, {"role": "system", "content": prompt.system})
        body["messages"] = messages
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt.full_text
        path = "/v1/completions"
    if config.temperature is not None:
        body["temperature"] = config.temperature
    if config.ignore_eos:
        body["ignore_eos"] = True
    headers = []
    if config.api_key:
        headers.append(("authorization", f"Bearer {config.api_key}"))
    if prompt.tenant is not None:
        body["user"] = prompt.tenant
        headers.append(("x-surge-tenant", prompt.tenant))
    if prompt.priority is not None:
        body["priority"] = prompt.priority
        headers.append(("x-surge-priority", str(prompt.priority)))
    body.update(dict(config.extra_body))
    return BenchRequest(path, body, tuple(headers), prompt)


def _embedding_request(prompt: Prompt, config: BenchConfig) -> BenchRequest:
    body: dict[str, object] = {
        "model": config.model,
        "input": prompt.full_text,
        "encoding_format": "base64",
    }
    headers = [("authorization", f"Bearer {config.api_key}")] if config.api_key else []
    if prompt.tenant is not None:
        body["user"] = prompt.tenant
        headers.append(("x-surge-tenant", prompt.tenant))
    body.update(dict(config.extra_body))
    return BenchRequest("/v1/embeddings", body, tuple(headers), prompt)


async def send_one(
    client: httpx.AsyncClient, req: BenchRequest, *, t0: float = 0.0
) -> RequestRecord:
    record = new_record(req.prompt)
    await send_into(client, req, record, t0=t0)
    return record


async def send_into(
    client: httpx.AsyncClient,
    req: BenchRequest,
    record: RequestRecord,
    *,
    t0: float,
    timeout_s: float | None = None,
) -> None:
    """Send `req` and fill `record`. Failures are recorded, not raised; a cancellation (the end of
    the run) marks the record cancelled and propagates. `timeout_s` bounds the whole request."""
    record.send_s = time.perf_counter() - t0
    try:
        async with asyncio.timeout(timeout_s):
            await _exchange(client, req, record, t0)
    except (TimeoutError, httpx.TimeoutException) as e:
        record.error_type, record.error = "timeout", f"{type(e).__name__}: {e}"
    except httpx.HTTPError as e:
        record.error_type, record.error = type(e).__name__, str(e) or type(e).__name__
    except asyncio.CancelledError:
        record.cancelled = True
        raise
    except Exception as e:  # a transport's own exception httpx did not wrap: record, go on
        record.error_type, record.error = type(e).__name__, str(e) or type(e).__name__
    finally:
        record.done_s = time.perf_counter() - t0


async def _exchange(
    client: httpx.AsyncClient, req: BenchRequest, record: RequestRecord, t0: float
) -> None:
    if req.path == "/v1/embeddings":
        await _embed(client, req, record, t0)
        return
    async with client.stream("POST", req.path, json=req.body, headers=dict(req.headers)) as resp:
        record.status = resp.status_code
        if resp.status_code != 200:
            record.error_type = f"http_{resp.status_code}"
            record.error = _error_message((await resp.aread()).decode(errors="replace"))
            return
        usage_per_chunk: list[int | None] = []
        done = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            now = time.perf_counter() - t0
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                record.error_type, record.error = "bad_sse", data[:200]
                return
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:
                record.error_type = "stream_error"
                record.error = _error_message(json.dumps(chunk))
                return
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                _apply_usage(record, usage)
            record.finish_reason = _finish_reason(chunk) or record.finish_reason
            if _has_text(chunk):
                record.chunk_s.append(now)
                usage_per_chunk.append(record.num_output_tokens if usage else None)
        if not done:
            record.error_type, record.error = "incomplete", "stream ended without [DONE]"
            return
        record.chunk_tokens = _chunk_tokens(record, usage_per_chunk)


async def _embed(
    client: httpx.AsyncClient, req: BenchRequest, record: RequestRecord, t0: float
) -> None:
    """One answer, not a stream: its arrival is both the first token and the end (TTFT = e2e),
    and it has no output tokens."""
    resp = await client.post(req.path, json=req.body, headers=dict(req.headers))
    record.status = resp.status_code
    if resp.status_code != 200:
        record.error_type, record.error = f"http_{resp.status_code}", _error_message(resp.text)
        return
    body = resp.json()
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not data:
        record.error_type, record.error = "bad_response", resp.text[:200]
        return
    record.chunk_s.append(time.perf_counter() - t0)
    usage = body.get("usage")
    if isinstance(usage, dict):
        _apply_usage(record, usage)
    record.num_output_tokens = 0
    record.finish_reason = "stop"


def _has_text(chunk: dict[str, object]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    c = choices[0]
    delta = c.get("delta")
    parts = [c.get("text")]
    if isinstance(delta, dict):
        parts += [delta.get("content"), delta.get("reasoning_content"), delta.get("reasoning")]
    return any(isinstance(p, str) and p for p in parts)


def _apply_usage(record: RequestRecord, usage: dict[str, object]) -> None:
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int):
        record.num_prompt_tokens = prompt
    if isinstance(completion, int):
        record.num_output_tokens = completion
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        record.num_cached_tokens = int(details["cached_tokens"])


def _chunk_tokens(record: RequestRecord, usage_per_chunk: list[int | None]) -> list[int] | None:
    """Tokens per chunk: from per-chunk usage (vLLM's continuous_usage_stats) when every chunk
    had it, else one each when the final count equals the number of chunks, else unknown."""
    n = len(usage_per_chunk)
    if n and all(u is not None for u in usage_per_chunk):
        totals = [0, *(int(u) for u in usage_per_chunk if u is not None)]
        return [b - a for a, b in itertools.pairwise(totals)]
    if record.num_output_tokens == n:
        return [1] * n
    return None


def _error_message(text: str) -> str:
    """The OpenAI error shape's message when the body has one, else the body (cut short)."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text[:500]
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    if isinstance(err, str):
        return err
    return text[:500]


def _finish_reason(chunk: dict[str, object]) -> str | None:
    choices = chunk.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
        return reason if isinstance(reason, str) else None
    return None
