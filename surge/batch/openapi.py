"""What /openapi.json declares for the Batch API's routes: each status they answer (errors in
the OpenAI shape), the upload's multipart form, a batch's JSON body, the lists' query."""

from __future__ import annotations

from typing import Any

from surge.http.openai_errors import ErrorResponse

_WHY = {
    400: "Invalid request: a bad field, a file over a line limit, a bad line count",
    401: "Missing or invalid API key (with --api-key)",
    404: "No such file or batch for this API key",
    413: "File over --batch-max-file-bytes",
    429: "A per-key limit reached (files, bytes, batches in flight; see Retry-After)",
    503: "The Batch API is off, or its data folder cannot be used (the reason is given)",
    507: "The data folder refused a write (disk full)",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorResponse, "description": _WHY[s]} for s in statuses}


READ = errors(400, 401, 404, 503)
WRITE = errors(400, 401, 404, 503, 507)
UPLOAD = errors(400, 401, 413, 429, 503, 507)
CREATE = errors(400, 401, 404, 429, 503, 507)
CONTENT = {
    200: {
        "description": "The file's bytes (JSONL)",
        "content": {"application/jsonl": {"schema": {"type": "string", "format": "binary"}}},
    },
    **READ,
}


def _query(*params: tuple[str, dict[str, Any], str]) -> dict[str, Any]:
    return {"parameters": [{"name": n, "in": "query", "required": False, "schema": s,
                            "description": d} for n, s, d in params]}  # fmt: skip


_AFTER = ("after", {"type": "string"}, "the last id of the page before")
LIST_FILES = _query(
    ("purpose", {"type": "string"}, "only files of this purpose"),
    ("limit", {"type": "integer", "minimum": 1, "maximum": 10000}, "at most this many"),
    ("order", {"type": "string", "enum": ["asc", "desc"]}, "by creation"),
    _AFTER,
)
LIST_BATCHES = _query(("limit", {"type": "integer", "minimum": 1, "maximum": 100}, ""), _AFTER)
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}
BATCH_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["input_file_id", "endpoint", "completion_window"],
                    "properties": {
                        "input_file_id": {"type": "string"},
                        "endpoint": {"type": "string"},
                        "completion_window": {"type": "string", "examples": ["24h", "1h"]},
                        "metadata": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        },
                    },
                }
            }
        },
    }
}
