"""POST /v1/responses: OpenAI's Responses API over the chat path, whole, as its typed events
(response.created ... response.output_text.delta ... response.completed; no [DONE]), or in the
background (`background: true`: answered at once as queued, then polled with GET; with
`stream: true` too, its events go to a log that any reader can follow again from a sequence
number, so a broken connection loses nothing; see stored_responses.py for GET, DELETE,
input_items and cancel)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.responses import StreamingResponse

from surge.engine.client.output_processor import SequenceDelta
from surge.http.headers import RESPONSE_ID_HEADER
from surge.server.errors import BadRequestError, SurgeHTTPError, error_body
from surge.server.event_log import EventLog
from surge.server.openai_responses import (
    ResponsesRequest,
    call_item,
    message_item,
    new_id,
    output_items,
    reasoning_item,
    response_body,
    unix_now,
    usage_body,
)
from surge.server.openapi import ADMITTED, with_200
from surge.server.protocol import ChatCompletionRequest
from surge.server.response_store import StoredResponse
from surge.server.routes.chat import ChatJob, start_chat
from surge.server.serving import Job, run_detached, run_to_completion, stream_response
from surge.server.state import ServerState, get_state
from surge.server.tenancy import key_owner
from surge.server.tool_parsers import ToolCallStream
from surge.server.tools import ToolCall

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/responses", response_model=None, responses=with_200(stream=True) | ADMITTED)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state = get_state(request)
    owner = key_owner(request, state.config)
    store = state.responses.enabled and body.store is not False
    if body.background and not store:
        raise BadRequestError(
            "background needs store: a background response must be stored", param="background"
        )
    earlier = _previous(state, body.previous_response_id, owner)
    items = body.input_items()
    try:
        chat_body = ChatCompletionRequest.model_validate(body.chat_fields(items, earlier))
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BadRequestError(f"{where}: {err['msg']}", param="input") from None
    chat = start_chat(state, chat_body, request, param="input")
    model = body.model or state.config.served_model_name
    rid, created = new_id("resp"), unix_now()
    headers = {RESPONSE_ID_HEADER: rid} if store else {}

    def save(response: dict[str, Any]) -> None:
        if store:
            context = [*(earlier or []), *items, *response["output"]]
            state.responses.put(StoredResponse(response, items, context, owner))

    if body.background:
        queued = response_body(body, model, rid, created, "queued", [], None, store)
        state.responses.put(StoredResponse(queued, items, [], owner))
        done = functools.partial(_finished, chat, body, model, rid, created, store)
        events = None
        if body.stream:
            events = _Logged(
                _ResponseStream(chat, body, model, rid, created, store, save),
                state.streams.open(rid),
            )
        task = asyncio.create_task(_in_background(chat, queued, done, save, events))
        state.background[rid] = task

        def ended(_: asyncio.Task[None]) -> None:
            state.background.pop(rid, None)
            state.streams.finish(rid)

        task.add_done_callback(ended)
        if events is not None:  # this client reads the log like any later one: it may go
            return StreamingResponse(
                events.log.follow(), media_type="text/event-stream", headers=headers
            )
        return JSONResponse(queued, headers=headers)
    if body.stream:
        stream = _ResponseStream(chat, body, model, rid, created, store, save).response()
        stream.headers.update(headers)
        return stream
    if not await run_to_completion(chat.job, request):
        return Response(status_code=499)
    out = _finished(chat, body, model, rid, created, store)
    save(out)
    return JSONResponse(out, headers=headers)


def _finished(
    chat: ChatJob, body: ResponsesRequest, model: str, rid: str, created: int, store: bool
) -> dict[str, Any]:
    """The response of a job run to its end."""
    choice = chat.job.choices[0]
    reasoning, rest = chat.split(choice.text)
    content, calls = chat.read_calls(rest)
    status = "incomplete" if choice.finish_reason == "length" else "completed"
    output = output_items(content, calls, reasoning)
    return response_body(body, model, rid, created, status, output, _usage(chat.job), store)


class _Logged:
    """A streamed background response's events, rendered into its log as the job runs."""

    def __init__(self, stream: _ResponseStream, log: EventLog) -> None:
        self.stream, self.log = stream, log

    def render(self, deltas: list[tuple[int, SequenceDelta]]) -> None:
        self.log.extend(self.stream.render(deltas))

    def end(self, failed: dict[str, Any] | None, cancelled: bool) -> None:
        """The closing events: the finished response (its `last` stores it), or the failure."""
        s = self.stream
        if cancelled:
            self.log.extend(
                [
                    s.event(
                        "error",
                        code="response_cancelled",
                        param=None,
                        message="the response was cancelled",
                    )
                ]
            )
        elif failed is not None:
            self.log.extend([s.event("response.failed", response=failed)])
        else:
            self.log.extend(s.last())


async def _in_background(
    chat: ChatJob,
    queued: dict[str, Any],
    finished: Callable[[], dict[str, Any]],
    save: Callable[[dict[str, Any]], None],
    events: _Logged | None,
) -> None:
    """Run a background response to its end and store what it came to: completed (or
    incomplete), failed with its error, or cancelled (POST .../cancel); streamed, its events
    go to its log as they come."""
    save({**queued, "status": "in_progress"})
    failed: dict[str, Any] | None = None
    try:
        if events is not None:
            events.log.extend(events.stream.opening(background=True))
        await run_detached(chat.job, None if events is None else events.render)
    except asyncio.CancelledError:
        save({**queued, "status": "cancelled"})
        if events is not None:
            events.end(None, cancelled=True)
        raise
    except SurgeHTTPError as e:
        failed = {**queued, "status": "failed", "error": error_body(e)["error"]}
    except Exception:  # never lose a background response to an unforeseen error
        log.exception("background response %s failed", queued["id"])
        failed = {
            **queued,
            "status": "failed",
            "error": {"code": "server_error", "message": "internal error"},
        }
    if failed is not None:
        save(failed)
    if events is not None:
        events.end(failed, cancelled=False)  # stores the finished response
    elif failed is None:
        save(finished())


def _previous(state: ServerState, response_id: str | None, owner: str) -> list[dict[str, Any]]:
    """The conversation `previous_response_id` continues (its items through its output)."""
    if response_id is None:
        return []
    if not state.responses.enabled:
        raise BadRequestError(
            "previous_response_id: this server stores no responses "
            "(--responses-store-max 0); send the conversation as input",
            param="previous_response_id",
        )
    entry = state.responses.get(response_id, owner)
    if entry is None:
        raise BadRequestError(
            f"Previous response with id '{response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if entry.response["status"] not in ("completed", "incomplete"):
        raise BadRequestError(
            f"Previous response with id '{response_id}' is "
            f"{entry.response['status']}, not finished.",
            param="previous_response_id",
        )
    return entry.context


def _usage(job: Job) -> dict[str, Any]:
    return usage_body(
        job.num_prompt_tokens, job.num_completion_tokens, job.timing.num_cached_tokens
    )


class _ResponseStream:
    """The events of one streamed response: a message item while text comes, a function_call
    item per call (arguments in pieces when the parser reads them as they are written)."""

    def __init__(
        self,
        chat: ChatJob,
        body: ResponsesRequest,
        model: str,
        rid: str,
        created: int,
        store: bool,
        save: Callable[[dict[str, Any]], None],
    ) -> None:
        self.chat, self.body, self.model, self.rid, self.created = chat, body, model, rid, created
        self.store, self.save = store, save  # save: given the finished response
        self.calls = ToolCallStream(chat.parser) if chat.parser is not None else None
        streams = chat.reasoning_streams()
        self.thinking = streams[0] if streams else None
        self.thought: int | None = None  # the open reasoning item's output index
        self.seq = 0
        self.items: list[dict[str, Any]] = []  # output items, completed or open
        self.message: int | None = None  # the open message's output index (None: none open)
        self.text = ""  # the open message's text so far
        self.open_calls: dict[int, int] = {}  # a call's index -> its output index
        self.status = "completed"

    def response(self) -> Response:
        return stream_response(self.chat.job, self.render, self.opening(), self.last, done=False)

    def opening(self, background: bool = False) -> list[str]:
        """created and in_progress; a background response is queued between the two."""
        first = "queued" if background else "in_progress"
        out = [self.event("response.created", response=self._body(first, None))]
        if background:
            out.append(self.event("response.queued", response=self._body("queued", None)))
        return [*out, self.event("response.in_progress", response=self._body("in_progress", None))]

    def render(self, deltas: list[tuple[int, SequenceDelta]]) -> list[str]:
        out: list[str] = []
        for _, d in deltas:
            final = d.finish_reason is not None
            text, fresh = self.chat.job.choices[0].text, d.text
            if self.thinking is not None:
                thought, fresh = self.thinking.update(text, final)
                text = self.thinking.content
                out += self._reasoning(thought) if thought else []
                if fresh or final or (self.calls is not None and text):
                    out += self._close_reasoning()
            if self.chat.plan is not None:  # a forced call: whole at the end
                if final:
                    content, calls = self.chat.answer(self.chat.job.choices[0].text)
                    out += self._text(content or "") if content else []
                    out += self._whole_calls(calls)
            elif self.calls is not None:
                content, pieces = self.calls.update(text, final)
                out += self._text(content) if content else []
                for piece in pieces:
                    out += self._call_piece(piece)
            elif fresh:
                out += self._text(fresh)
            if final:
                self.status = "incomplete" if d.finish_reason == "length" else "completed"
                out += self._close_message() + self._close_calls()
        return out

    def last(self) -> list[str]:
        if all(item["type"] == "reasoning" for item in self.items):
            # no answer written: an empty message, as a whole answer has
            self.items.append(message_item(new_id("msg"), ""))
        done = self._body(self.status, _usage(self.chat.job))
        self.save(done)
        return [self.event(f"response.{self.status}", response=done)]

    # -- items ------------------------------------------------------------------------------

    def _text(self, delta: str) -> list[str]:
        out = []
        if self.message is None:
            item = message_item(new_id("msg"), "", status="in_progress")
            self.items.append(item)
            self.message, self.text = self._index, ""
            part = {"type": "output_text", "text": "", "annotations": []}
            out += [
                self.event("response.output_item.added", output_index=self._index, item=item),
                self.event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._index,
                    content_index=0,
                    part=part,
                ),
            ]
        self.text += delta
        index = self.message
        out.append(
            self.event(
                "response.output_text.delta",
                item_id=self.items[index]["id"],
                output_index=index,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return out

    def _reasoning(self, delta: str) -> list[str]:
        out = []
        if self.thought is None:
            self.items.append(reasoning_item(new_id("rs"), "", status="in_progress"))
            self.thought = self._index
            out.append(
                self.event(
                    "response.output_item.added", output_index=self._index, item=self.items[-1]
                )
            )
        item = self.items[self.thought]
        item["content"][0]["text"] += delta
        out.append(
            self.event(
                "response.reasoning_text.delta",
                item_id=item["id"],
                output_index=self.thought,
                content_index=0,
                delta=delta,
            )
        )
        return out

    def _close_reasoning(self) -> list[str]:
        index, self.thought = self.thought, None
        if index is None:
            return []
        item = self.items[index] = {**self.items[index], "status": "completed"}
        text = item["content"][0]["text"]
        return [
            self.event(
                "response.reasoning_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=text,
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _close_message(self) -> list[str]:
        index = self.message
        if index is None:
            return []
        item = message_item(self.items[index]["id"], self.text)
        self.items[index] = item
        part = item["content"][0]
        self.message = None
        common = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self.event("response.output_text.done", **common, text=part["text"], logprobs=[]),
            self.event("response.content_part.done", **common, part=part),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _call_piece(self, piece: dict[str, Any]) -> list[str]:
        out: list[str] = []
        function = piece["function"]
        if "id" in piece:  # a new call: the text before it is over
            out += self._close_message()
            call = ToolCall(function["name"], "", piece["id"])
            self.items.append(call_item(new_id("fc"), call, status="in_progress"))
            self.open_calls[piece["index"]] = len(self.items) - 1
            out.append(
                self.event(
                    "response.output_item.added", output_index=self._index, item=self.items[-1]
                )
            )
        index = self.open_calls[piece["index"]]
        if function.get("arguments"):
            self.items[index]["arguments"] += function["arguments"]
            out.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=self.items[index]["id"],
                    output_index=index,
                    delta=function["arguments"],
                )
            )
        return out

    def _close_calls(self) -> list[str]:
        out = []
        for index in self.open_calls.values():
            item = self.items[index] = {**self.items[index], "status": "completed"}
            out += [
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                ),
                self.event("response.output_item.done", output_index=index, item=item),
            ]
        self.open_calls = {}
        return out

    def _whole_calls(self, calls: list[ToolCall]) -> list[str]:
        out = self._close_message()
        for call in calls:
            self.items.append(call_item(new_id("fc"), call, status="in_progress"))
            self.open_calls[len(self.open_calls)] = len(self.items) - 1
            out.append(
                self.event(
                    "response.output_item.added", output_index=self._index, item=self.items[-1]
                )
            )
        return out

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _body(self, status: Any, usage: dict[str, Any] | None) -> dict[str, Any]:
        done = status != "in_progress"
        return response_body(
            self.body,
            self.model,
            self.rid,
            self.created,
            status,
            self.items if done else [],
            usage,
            self.store,
        )

    def event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"
