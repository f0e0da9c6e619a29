"""Which headers the gateway passes between client and upstream: all but the hop-by-hop ones
(RFC 9110 §7.6.1) and those httpx/uvicorn set themselves."""

from __future__ import annotations

from collections.abc import Mapping

from surge.observability.tracing import TRACE_HEADERS

UPSTREAM_HEADER = "x-surge-upstream"  # on every answer: which replica gave it
_DROP_REQUEST = frozenset({
    "host", "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
    "upgrade", "content-length", "accept-encoding",
})  # fmt: skip
_DROP_RESPONSE = frozenset({
    "connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
    "date", "server",
})  # fmt: skip
_TRACE = frozenset(TRACE_HEADERS)


def forward_headers(headers: Mapping[str, str], tracing: bool = False) -> dict[str, str]:
    """The client's headers for the upstream (authorization, x-surge-tenant, x-surge-priority
    and the rest), minus hop-by-hop ones. Tracing, each attempt sends its own `traceparent`
    instead of the client's; otherwise the client's passes through untouched."""
    drop = _DROP_REQUEST | _TRACE if tracing else _DROP_REQUEST
    return {k: v for k, v in headers.items() if k.lower() not in drop}


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """An upstream's answer headers for the client, minus hop-by-hop ones."""
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_RESPONSE}
