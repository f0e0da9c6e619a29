"""OpenAI's Responses API (POST /v1/responses) with the official `openai` client, on the tiny
model's server: the same prompt and greedy answer as the chat request it amounts to, its typed
stream events, function calls (read back by the server's tool parser) and the next turn, and
stored responses: previous_response_id, retrieve, input_items, delete."""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.server.test_structured_output import WEATHER
from tests.server.test_tool_calls import CALL
from tests.servers import ServerProcess

TOOL = {"type": "function", **WEATHER["function"]}  # the Responses API's flat form


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_a_response_is_the_chat_answer_whole_and_streamed(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    chat = client.chat.completions.create(
        model="test-model", max_tokens=10, temperature=0.0,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Name a color."}],
    )  # fmt: skip
    resp = client.responses.create(model="test-model", instructions="Be brief.",
                                   input="Name a color.", max_output_tokens=10,
                                   temperature=0.0, metadata={"run": "1"})  # fmt: skip
    assert resp.id.startswith("resp_") and resp.object == "response"
    assert resp.output_text == chat.choices[0].message.content
    assert resp.status == ("incomplete" if chat.choices[0].finish_reason == "length" else
                           "completed")  # fmt: skip
    assert resp.usage is not None and chat.usage is not None
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens
    assert resp.metadata == {"run": "1"}
    stream = client.responses.create(
        model="test-model", max_output_tokens=10, temperature=0.0, stream=True,
        input=[{"role": "developer", "content": "Be brief."},
               {"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}],
    )  # fmt: skip
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas == final.output_text == resp.output_text
    assert events[-1].type == f"response.{final.status}"


def test_function_calls_and_the_next_turn(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    ask = "What is the weather in Oslo?"
    resp = client.responses.create(
        model="test-model", input=ask, tools=[TOOL], max_output_tokens=80,  # type: ignore[list-item]
        temperature=1.0, extra_body={"structured_outputs": {"regex": CALL}},
    )  # fmt: skip
    kinds = [o.type for o in resp.output]
    assert kinds == ["message", "function_call"], kinds
    call = resp.output[1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments)["unit"] == "C" and call.call_id.startswith("call_")
    stream = client.responses.create(
        model="test-model", input=ask, tools=[TOOL], max_output_tokens=80,  # type: ignore[list-item]
        temperature=1.0, stream=True, extra_body={"structured_outputs": {"regex": CALL}},
    )  # fmt: skip
    events = list(stream)
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(pieces) > 1 and len(done) == 1 and "".join(pieces) == done[0].arguments
    # The next turn: the call and its output go back as input items.
    follow = client.responses.create(
        model="test-model", tools=[TOOL], max_output_tokens=4,  # type: ignore[list-item]
        input=[{"role": "user", "content": ask},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "12 C"}],
    )  # fmt: skip
    assert follow.usage is not None and follow.usage.input_tokens > resp.usage.input_tokens  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "x", "previous_response_id": "resp_gone"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
         "input"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": []}, "input"),
    ],
)  # fmt: skip
def test_what_is_not_served_is_a_400(
    tiny_server: ServerProcess, fields: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _client(tiny_server).responses.create(model="test-model", **fields)  # type: ignore[call-overload]
    assert err.value.body["param"] == param  # type: ignore[index]


def test_previous_response_id_continues_the_stored_conversation(
    tiny_server: ServerProcess,
) -> None:
    client = _client(tiny_server)
    common = {"model": "test-model", "instructions": "Be brief.", "max_output_tokens": 6,
              "temperature": 0.0}  # fmt: skip
    first = client.responses.create(input="Name a color.", **common)  # type: ignore[arg-type]
    assert first.store is True
    # Streamed, and continuing the first: stored when it ends, as a whole one is.
    events = list(
        client.responses.create(
            input=[{"role": "user", "content": "Another?"}],
            previous_response_id=first.id,
            stream=True,
            **common,
        )
    )  # type: ignore[call-overload]
    second = events[-1].response  # type: ignore[union-attr]
    assert second.previous_response_id == first.id
    third = client.responses.create(input="And a third?", previous_response_id=second.id, **common)  # type: ignore[arg-type]
    # The same prompt and greedy answer as the whole conversation sent as chat messages.
    chat = client.chat.completions.create(
        model="test-model", max_tokens=6, temperature=0.0,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Name a color."},
                  {"role": "assistant", "content": first.output_text},
                  {"role": "user", "content": "Another?"},
                  {"role": "assistant", "content": second.output_text},
                  {"role": "user", "content": "And a third?"}],
    )  # fmt: skip
    assert third.output_text == chat.choices[0].message.content
    assert third.usage is not None and chat.usage is not None
    assert third.usage.input_tokens == chat.usage.prompt_tokens
    # Retrieved as answered; its own input items (not the earlier turns'), newest first.
    got = client.responses.retrieve(third.id)
    assert got.model_dump() == third.model_dump()
    items = client.responses.input_items.list(second.id, order="asc")
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [  # type: ignore[union-attr]
        ("message", "user", "Another?")]  # fmt: skip
    assert items.data[0].id.startswith("msg_")
    client.responses.delete(second.id)
    for call in (lambda: client.responses.retrieve(second.id),
                 lambda: client.responses.delete(second.id)):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call()
    # Deleting a turn does not break the ones after it: each holds its conversation.
    fourth = client.responses.create(input="More?", previous_response_id=third.id, **common)  # type: ignore[arg-type]
    assert fourth.usage is not None and fourth.usage.input_tokens > third.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(input="x", previous_response_id=second.id, **common)  # type: ignore[arg-type]
    assert err.value.code == "previous_response_not_found"


def test_store_false_is_not_kept(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    resp = client.responses.create(model="test-model", input="Hi", max_output_tokens=2,
                                   store=False)  # fmt: skip
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_background_responses_are_polled_and_can_be_cancelled(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    ask = {"model": "test-model", "input": "Name a color.", "max_output_tokens": 8,
           "temperature": 0.0}  # fmt: skip
    queued = client.responses.create(background=True, **ask)  # type: ignore[call-overload]
    assert queued.background is True and queued.status in ("queued", "in_progress")
    deadline = time.monotonic() + 30
    while (got := client.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, got.status
        time.sleep(0.05)
    whole = client.responses.create(**ask)  # type: ignore[call-overload]
    assert got.status == whole.status and got.output_text == whole.output_text
    assert got.usage is not None and got.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]
    # A long one, cancelled while it runs: its engine request ends, its status says so.
    long = client.responses.create(model="test-model", input="Go on.", max_output_tokens=1500,
                                   background=True)  # fmt: skip
    assert tiny_server.metric("surge:responses_background", model_name="test-model") >= 1
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert tiny_server.metric("surge:responses_stored", model_name="test-model") >= 2
    assert client.responses.retrieve(long.id).status == "cancelled"
    running = client.responses.create(model="test-model", input="Go on.", max_output_tokens=1500,
                                      background=True)  # fmt: skip
    client.responses.delete(running.id)  # stops it, and it stays deleted
    time.sleep(0.2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(running.id)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(background=True, store=False, **ask)  # type: ignore[call-overload]
    assert err.value.body["param"] == "background"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:  # its events were not kept
        client.responses.retrieve(whole.id, stream=True)
    assert err.value.body["param"] == "stream"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):  # only a background one can be cancelled
        client.responses.cancel(whole.id)


def test_a_streamed_background_response_is_read_again_from_any_event(
    tiny_server: ServerProcess,
) -> None:
    """The connection of a background stream breaks: the response goes on, and GET with
    stream=true takes up its events after the last one seen; all of them read again after
    it ended; one cancelled while followed ends its readers with an error event."""
    client = _client(tiny_server)
    ask = {"model": "test-model", "input": "Name a color.", "max_output_tokens": 40,
           "temperature": 0.0}  # fmt: skip
    seen = []
    with client.responses.create(background=True, stream=True, **ask) as stream:  # type: ignore[call-overload]
        for event in stream:
            seen.append(event)
            if len(seen) == 6:
                break  # the client goes away
    kinds = [e.type for e in seen]
    assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
    first = seen[0].response
    assert first.status == "queued" and first.background is True
    rest = list(client.responses.retrieve(first.id, stream=True, starting_after=5))
    events = seen + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert events[-1].type == f"response.{final.status}"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == client.responses.retrieve(first.id).output_text
    assert text == client.responses.create(**ask).output_text  # type: ignore[call-overload]
    again = list(client.responses.retrieve(first.id, stream=True))
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events]
    long = client.responses.create(model="test-model", input="Go on.", max_output_tokens=1500,
                                   background=True, stream=True)  # fmt: skip
    opening = next(iter(long))
    assert client.responses.cancel(opening.response.id).status == "cancelled"  # type: ignore[union-attr]
    tail = list(long)
    assert tail[-1].type == "error" and tail[-1].code == "response_cancelled"  # type: ignore[union-attr]
