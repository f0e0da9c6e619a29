"""The Batch API's errors, in the OpenAI shape (both the server and the gateway render them)."""

from __future__ import annotations

from surge.http.openai_errors import OpenAIError


class BatchBadRequest(OpenAIError):
    status_code = 400
    type = "invalid_request_error"


class BatchNotFound(OpenAIError):
    status_code = 404
    type = "invalid_request_error"
    default_code = "not_found"


class BatchTooLarge(OpenAIError):
    status_code = 413
    type = "invalid_request_error"
    default_code = "file_too_large"


class BatchLimitReached(OpenAIError):
    """A per-key limit (files, bytes, batches in flight): 429 with Retry-After."""

    status_code = 429
    type = "rate_limit_error"


class BatchUnavailable(OpenAIError):
    """The Batch API is off, or its data folder cannot be used; real-time serving goes on."""

    status_code = 503
    type = "service_unavailable_error"
    default_code = "batch_unavailable"


class BatchStorageFull(OpenAIError):
    """The data folder refused a write (disk full, read-only); nothing was kept."""

    status_code = 507
    type = "server_error"
    default_code = "insufficient_storage"
