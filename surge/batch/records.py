"""The Batch API's shapes, as OpenAI writes them: file and batch objects, and the lines of the
output and error files. Pure functions of the stored rows; no I/O."""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from typing import Any

# Batch statuses (OpenAI's): the path is validating -> in_progress -> finalizing -> completed,
# or failed (nothing to run), expired (the window ended first), cancelling -> cancelled.
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
DONE = ("completed", "failed", "expired", "cancelled")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def owner_of(authorization: str | None) -> str:
    """Who owns a file or batch: the SHA-256 of the bearer token (never the key itself), or ""
    for requests without one."""
    auth = (authorization or "").strip()
    if not auth.lower().startswith("bearer "):
        return ""
    return hashlib.sha256(auth[7:].strip().encode()).hexdigest()


def tenant_of(owner: str) -> str:
    """The engine's tenant for an owner: the server's own name for an API key's tenant
    (surge/server/tenancy.py key_owner: "key-" and the hash's first 12 hex digits)."""
    return "key-" + owner[:12] if owner else ""


@dataclass(frozen=True, slots=True)
class FileRow:
    id: str
    owner: str
    filename: str
    purpose: str
    bytes: int
    created_at: int


def file_object(f: FileRow) -> dict[str, Any]:
    return {
        "id": f.id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": f.created_at,
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


@dataclass(frozen=True, slots=True)
class BatchRow:
    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    times: dict[str, int | None]  # in_progress_at, finalizing_at, ... (None: not yet)
    output_file_id: str | None
    error_file_id: str | None
    total: int
    completed: int
    failed: int
    metadata: dict[str, str] | None
    errors: list[dict[str, Any]]  # validation errors, by line
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    invalid: int = 0  # lines refused at validation


TIME_FIELDS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def batch_object(b: BatchRow) -> dict[str, Any]:
    return {
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "errors": {"object": "list", "data": b.errors} if b.errors else None,
        "input_file_id": b.input_file_id,
        "completion_window": b.completion_window,
        "status": b.status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": b.created_at,
        "expires_at": b.expires_at,
        **{name: b.times.get(name) for name in TIME_FIELDS},
        "request_counts": {"total": b.total, "completed": b.completed, "failed": b.failed},
        "usage": {
            "input_tokens": b.prompt_tokens,
            "input_tokens_details": {"cached_tokens": b.cached_tokens},
            "output_tokens": b.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": b.prompt_tokens + b.completion_tokens,
        },
        "metadata": b.metadata,
    }


def page(objects: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A cursor page (`after` = the last id of the page before)."""
    return {
        "object": "list",
        "data": objects,
        "first_id": objects[0]["id"] if objects else None,
        "last_id": objects[-1]["id"] if objects else None,
        "has_more": has_more,
    }


def response_line(custom_id: str | None, status_code: int, request_id: str, body: Any) -> str:
    """An output (2xx) or error (other status) file line for a request that was answered."""
    return json.dumps(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body},
            "error": None,
        },
        ensure_ascii=False,
    )


def error_line(custom_id: str | None, code: str, message: str) -> str:
    """An error file line for a request that never got an answer (bad line, expired, ...)."""
    return json.dumps(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        },
        ensure_ascii=False,
    )
