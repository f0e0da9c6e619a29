"""Who a request is for and how urgent it is: tenant and priority from headers, body or key.

The tenant drives fair share in the engine, the per-tenant queue bound and rate limits, and the
per-tenant metrics. A gateway in front sets the tenant and priority headers; a direct client may
use the OpenAI `user` field (or vLLM's `priority`); with API keys and neither, each key is a tenant.
"""

from __future__ import annotations

import hashlib

from fastapi import Request

from surge.server.config import ServerConfig
from surge.server.errors import BadRequestError

MAX_TENANT_CHARS = 128
PRIORITY_RANGE = (-(2**31), 2**31 - 1)


def resolve_tenant(request: Request, user: str | None, config: ServerConfig) -> str:
    """Header, else `user`, else a hash of the API key (never the key itself), else ""."""
    tenant = request.headers.get(config.auth.tenant_header, "").strip() or (user or "").strip()
    if not tenant:
        return key_owner(request, config)
    if len(tenant) > MAX_TENANT_CHARS:
        raise BadRequestError(
            f"tenant (header {config.auth.tenant_header!r} or 'user') is longer than "
            f"{MAX_TENANT_CHARS} characters",
            param="user",
        )
    return tenant


def key_owner(request: Request, config: ServerConfig) -> str:
    """The API key's hash ("key-<12 hex>", never the key itself), or "" without API keys."""
    auth = request.headers.get("authorization", "")
    if not (auth.lower().startswith("bearer ") and config.auth.api_keys):
        return ""
    return "key-" + hashlib.sha256(auth[7:].strip().encode()).hexdigest()[:12]


def resolve_priority(request: Request, body_priority: int | None, config: ServerConfig) -> int:
    """The body's `priority` when given, else the priority header, else 0 (lower runs sooner)."""
    if body_priority is not None:
        value = body_priority
    else:
        header = request.headers.get(config.auth.priority_header)
        if header is None:
            return 0
        try:
            value = int(header.strip())
        except ValueError:
            raise BadRequestError(
                f"header {config.auth.priority_header!r} must be an integer, got {header!r}",
                param="priority",
            ) from None
    if not PRIORITY_RANGE[0] <= value <= PRIORITY_RANGE[1]:
        raise BadRequestError("priority must be a 32-bit integer", param="priority")
    return value
