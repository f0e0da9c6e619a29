"""Stored Responses API responses: GET and DELETE /v1/responses/{id}, GET
/v1/responses/{id}/input_items, and POST /v1/responses/{id}/cancel for a background one; GET
with `stream=true` reads a streamed background response's events again, from the one after
`starting_after`, live while it runs."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.responses import StreamingResponse

from surge.http.headers import RESPONSE_ID_HEADER
from surge.server.errors import BadRequestError, NotFoundError
from surge.server.openapi import LOOKUP, with_200
from surge.server.response_store import StoredResponse
from surge.server.state import get_state
from surge.server.tenancy import key_owner

router = APIRouter()


def _stored(request: Request, response_id: str) -> StoredResponse:
    state = get_state(request)
    entry = state.responses.get(response_id, key_owner(request, state.config))
    if entry is None:
        raise NotFoundError(
            f"Response with id '{response_id}' not found.", code="response_not_found"
        )
    return entry


@router.get(
    "/v1/responses/{response_id}", response_model=None, responses=with_200(stream=True) | LOOKUP
)
async def get_response(
    response_id: str,
    request: Request,
    stream: bool = False,
    starting_after: int = Query(-1, ge=-1),
) -> Response:
    """As it was answered; a background one as it stands (queued, in_progress, ... done)."""
    entry = _stored(request, response_id)
    headers = {RESPONSE_ID_HEADER: response_id}
    if not stream:
        return JSONResponse(entry.response, headers=headers)
    events = get_state(request).streams.get(response_id)
    if events is None:
        raise BadRequestError(
            "stream: only a background response created with stream: true "
            "can be streamed, and only while it runs or among the last "
            "finished ones",
            param="stream",
        )
    if starting_after >= len(events.events) and events.closed:
        raise BadRequestError(
            f"starting_after: the response has {len(events.events)} events", param="starting_after"
        )
    return StreamingResponse(
        events.follow(starting_after), media_type="text/event-stream", headers=headers
    )


@router.delete("/v1/responses/{response_id}", responses=LOOKUP)
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    state = get_state(request)
    _stored(request, response_id)  # 404 unless it is this key's
    await _stop(state.background.get(response_id))  # deleting a running one stops it first
    state.responses.delete(response_id, key_owner(request, state.config))
    state.streams.drop(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel", responses=LOOKUP)
async def cancel_response(response_id: str, request: Request) -> JSONResponse:
    """Stop a background response (its engine request is aborted); one that has ended is
    answered as it is."""
    state = get_state(request)
    entry = _stored(request, response_id)
    if not entry.response.get("background"):
        raise BadRequestError("only a background response can be cancelled", param="response_id")
    await _stop(state.background.get(response_id))
    return JSONResponse(
        _stored(request, response_id).response, headers={RESPONSE_ID_HEADER: response_id}
    )


async def _stop(task: asyncio.Task[None] | None) -> None:
    """Cancel a background response's task and wait until it has stored its end."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@router.get("/v1/responses/{response_id}/input_items", responses=LOOKUP)
async def list_input_items(
    response_id: str,
    request: Request,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> JSONResponse:
    """One page of the request's input items, OpenAI's list shape (newest first by default)."""
    items = _stored(request, response_id).input_items
    items = items[::-1] if order == "desc" else items
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise BadRequestError(f"after: no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    first, last = (page[0]["id"], page[-1]["id"]) if page else (None, None)
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": first,
            "last_id": last,
            "has_more": len(items) > limit,
        }
    )
