"""tool_choice "auto" through HTTP with the official `openai` client: the tiny model's server
runs with --enable-auto-tool-choice (Hermes' syntax, taught in the system message since the
SmolLM2 template renders no tools). A regex makes the random model write a call, so what is
tested is the server reading it back from real generated tokens, streamed and not."""

from __future__ import annotations

import json
import re

import httpx
import openai

from tests.server.test_structured_output import ASK, TIME, WEATHER
from tests.servers import ServerProcess

# Text, then one call, as a Hermes model writes them; the city is left to the model.
CALL = (
    r'Checking\.\n<tool_call>\n\{"name": "get_weather", "arguments": '
    r'\{"city": "(Oslo|Paris|Rome)", "unit": "C"\}\}\n</tool_call>'
)


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_auto_reads_a_call_back_from_the_output(tiny_server: ServerProcess) -> None:
    resp = _client(tiny_server).chat.completions.create(
        model="test-model", messages=ASK, tools=[WEATHER, TIME], max_tokens=80, n=2,
        temperature=1.0, seed=1, extra_body={"structured_outputs": {"regex": CALL}},
    )  # fmt: skip
    ids = set()
    for choice in resp.choices:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Checking.\n"
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        assert args["unit"] == "C" and args["city"] in ("Oslo", "Paris", "Rome")
        ids.add(call.id)
    assert len(ids) == 2


def test_auto_streams_content_then_the_call_in_pieces(tiny_server: ServerProcess) -> None:
    stream = _client(tiny_server).chat.completions.create(
        model="test-model", messages=ASK, tools=[WEATHER], max_tokens=80, temperature=1.0,
        seed=2, stream=True, extra_body={"structured_outputs": {"regex": CALL}},
    )  # fmt: skip
    content, name, ids, pieces, finish = "", None, set(), [], None
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                assert tc.index == 0
                if tc.id:
                    ids.add(tc.id)
                if tc.function and tc.function.name:
                    assert name is None  # the name comes once, with the id
                    name = tc.function.name
                if tc.function and tc.function.arguments:
                    pieces.append(tc.function.arguments)
            finish = c.finish_reason or finish
    # Nothing of the markup leaks into the content; the arguments come as they are written.
    assert content == "Checking.\n" and name == "get_weather" and len(ids) == 1
    assert len(pieces) > 1 and json.loads("".join(pieces))["unit"] == "C"
    assert finish == "tool_calls"


def test_auto_answers_in_text_and_carries_tools_in_the_prompt(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    plain = client.chat.completions.create(model="test-model", messages=ASK, max_tokens=4,
                                           temperature=0.0)  # fmt: skip
    text = client.chat.completions.create(
        model="test-model", messages=ASK, tools=[WEATHER, TIME], tool_choice="auto",
        max_tokens=12, temperature=1.0, seed=3,
        extra_body={"structured_outputs": {"regex": r"It is sunny in [A-Z][a-z]{2,8}\."}},
    )  # fmt: skip
    choice = text.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert re.fullmatch(r"It is sunny in [A-Z][a-z]{2,8}\.", choice.message.content or "")
    # The template renders no tools, so the system message lists them (Hermes' <tools>).
    assert text.usage and plain.usage
    assert text.usage.prompt_tokens > plain.usage.prompt_tokens + 100
    # An agent loop's next turn: the call and the tool's answer render in the same syntax.
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'},
    }
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C, light rain"},
    ]
    follow = client.chat.completions.create(model="test-model", messages=history,
                                            tools=[WEATHER], max_tokens=4)  # fmt: skip
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert follow.usage and follow.usage.prompt_tokens > text.usage.prompt_tokens


def test_tokenize_renders_what_chat_renders(tiny_server: ServerProcess) -> None:
    """/tokenize with messages counts the prompt chat runs: its tools, and an assistant message
    left open by continue_final_message (no end of turn after it)."""
    client = _client(tiny_server)
    opened = [*ASK, {"role": "assistant", "content": "The weather in Oslo is"}]
    for extra in ({"tools": [WEATHER]}, {"continue_final_message": True}):
        messages = opened if "continue_final_message" in extra else ASK
        counted = httpx.post(tiny_server.url + "/tokenize",
                             json={"messages": messages, **extra}).json()  # fmt: skip
        chat = client.chat.completions.create(model="test-model", messages=messages,  # type: ignore[arg-type]
                                              max_tokens=1, extra_body=extra)  # fmt: skip
        assert chat.usage is not None and counted["count"] == chat.usage.prompt_tokens, extra
    text = httpx.post(tiny_server.url + "/detokenize", json={"tokens": counted["tokens"]}).json()
    assert text["prompt"].endswith("The weather in Oslo is")
    both = {"messages": opened, "continue_final_message": True, "add_generation_prompt": True}
    r = httpx.post(tiny_server.url + "/v1/chat/completions", json=both)
    assert r.status_code == 400 and "cannot both be true" in r.json()["error"]["message"]
