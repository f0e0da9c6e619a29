"""X-Request-Id: one id for a request from the client through the gateway to the server.

The id a client sends (printable ASCII, at most 128 characters) is kept, else one is made; the
gateway forwards it on every attempt, and each hop answers with it, errors included, so one id
finds a request in the client's, the gateway's and the server's logs and traces. The server
names the engine request after it where the body gives no `request_id` (vLLM's
`--enable-request-id-headers`, on here: it costs one header).
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
MAX_LENGTH = 128
_NAME = REQUEST_ID_HEADER.encode()


def given_id(scope: Scope) -> str | None:
    """The client's id, if it sent a usable one."""
    for key, value in scope.get("headers", ()):
        if key.lower() == _NAME:
            text = bytes(value).decode("latin-1").strip()
            if 0 < len(text) <= MAX_LENGTH and text.isascii() and text.isprintable():
                return text
            return None
    return None


class RequestIdMiddleware:
    """Puts the request's id in `scope["state"]["request_id"]` and on the response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = given_id(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != _NAME]
                message = {**message, "headers": [*headers, (_NAME, rid.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)
