"""Structured output through HTTP with the official `openai` client: OpenAI's `response_format`
and vLLM's `guided_*` / `structured_outputs`, streamed and not, on the tiny random model (whose
well-formed answers can only come from the constraint) and on the real SmolLM2."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.servers import ServerProcess

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _check_person(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 10
    assert isinstance(value["age"], int) and 0 <= value["age"] <= 99


def test_response_format_json_schema(tiny_server: ServerProcess) -> None:
    resp = _client(tiny_server).chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": "A person, please."}],
        max_tokens=100, temperature=1.0, seed=4, n=2,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )  # fmt: skip
    assert len(resp.choices) == 2
    for choice in resp.choices:
        _check_person(choice.message.content or "")
        assert choice.finish_reason == "stop"


def test_streamed_json_object_and_regex(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    stream = client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "JSON!"}],
        max_tokens=200, temperature=0.0, stream=True, response_format={"type": "json_object"},
    )  # fmt: skip
    parts, finish = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    text = "".join(parts)
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # a random model may nest deeper than max_tokens allows
        assert finish == "length" and text.startswith("{")
    # [0-9], not \d: llguidance's \d takes every Unicode digit of a newer Unicode than this
    # Python's re knows (a random model once wrote U+10D48, a Garay digit).
    pattern = r"[0-9]{3}-[0-9]{4}"
    stream = client.completions.create(
        model="test-model", prompt="Call me at", max_tokens=20, temperature=1.0, stream=True,
        seed=7, extra_body={"guided_regex": pattern},
    )  # fmt: skip
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert re.fullmatch(pattern, text), text


def test_choice_and_grammar_in_vllm_forms(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    choices = ["red", "green", "blue"]
    resp = client.completions.create(
        model="test-model", prompt=["Pick a colour:", "Another:"], max_tokens=10,
        temperature=1.0, extra_body={"structured_outputs": {"choice": choices}},
    )  # fmt: skip
    assert len(resp.choices) == 2 and all(c.text in choices for c in resp.choices)
    grammar = 'start: "SELECT " COL " FROM t"\nCOL: "a" | "b" | "*"'
    resp = client.completions.create(
        model="test-model", prompt="SQL:", max_tokens=20, temperature=1.0,
        extra_body={"guided_grammar": grammar},
    )  # fmt: skip
    assert re.fullmatch(r"SELECT (a|b|\*) FROM t", resp.choices[0].text)


def test_bad_constraints_are_400_in_the_openai_shape(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="test-model", prompt="x",
                                  extra_body={"guided_regex": "(unclosed"})  # fmt: skip
    assert err.value.body["param"] == "guided_regex"  # type: ignore[index]
    assert "the regex is not valid" in err.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"type": "wat"}}},
        )  # fmt: skip
    assert err.value.body["param"] == "response_format"  # type: ignore[index]
    # The server is unharmed: the next request is served.
    ok = client.completions.create(model="test-model", prompt="x", max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


@pytest.fixture(scope="module")
def smollm2_server(smollm2_gguf_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(smollm2_gguf_path)  # the defaults: q4 on a CPU
    yield server
    server.stop()


@pytest.mark.slow
def test_the_real_model_answers_in_the_schema(smollm2_server: ServerProcess) -> None:
    schema = {
        "type": "object",
        "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
        "required": ["country", "capital"],
        "additionalProperties": False,
    }
    resp = _client(smollm2_server).chat.completions.create(
        model="test-model",
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        max_tokens=60, temperature=0.0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )  # fmt: skip
    answer = json.loads(resp.choices[0].message.content or "")
    assert answer["capital"] == "Paris"
    assert resp.choices[0].finish_reason == "stop"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}  # fmt: skip
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                       "required": ["zone"], "additionalProperties": False},
    },
}  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


def _check_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("C", "F")
    assert isinstance(args["city"], str) and len(args["city"]) <= 20


def test_a_named_function_is_called_with_arguments_in_its_schema(
    tiny_server: ServerProcess,
) -> None:
    client = _client(tiny_server)
    named = {"type": "function", "function": {"name": "get_weather"}}
    resp = client.chat.completions.create(model="test-model", messages=ASK, tools=[WEATHER, TIME],
                                          tool_choice=named, max_tokens=60, temperature=1.0,
                                          seed=2)  # fmt: skip
    msg = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls" and msg.content is None
    (call,) = msg.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    _check_weather(call.function.arguments)
    # Streamed: the arguments arrive in pieces under one call id.
    stream = client.chat.completions.create(model="test-model", messages=ASK, tools=[WEATHER],
                                            tool_choice=named, max_tokens=60, temperature=1.0,
                                            seed=3, stream=True)  # fmt: skip
    ids, names, pieces, finish = set(), [], [], None
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                if tc.id:
                    ids.add(tc.id)
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                if tc.function and tc.function.arguments:
                    pieces.append(tc.function.arguments)
            finish = c.finish_reason or finish
    assert len(ids) == 1 and names == ["get_weather"] and len(pieces) > 1
    _check_weather("".join(pieces))
    assert finish == "tool_calls"


def test_required_calls_one_of_the_tools_and_the_answer_can_follow(
    tiny_server: ServerProcess,
) -> None:
    client = _client(tiny_server)
    resp = client.chat.completions.create(model="test-model", messages=ASK, tools=[WEATHER, TIME],
                                          tool_choice="required", max_tokens=120,
                                          temperature=1.0, seed=5)  # fmt: skip
    choice = resp.choices[0]
    if choice.finish_reason == "length":  # a random model may list calls past max_tokens
        assert choice.message.tool_calls is None and (choice.message.content or "")[0] == "["
        return
    calls = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and calls
    for call in calls:
        assert call.function.name in ("get_weather", "get_time")
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            _check_weather(call.function.arguments)
        else:
            assert args in ({"zone": "UTC"}, {"zone": "CET"})
    # The next turn carries the calls and a tool's answer; it is served as plain chat.
    answer = {"role": "tool", "tool_call_id": calls[0].id, "content": "12 C, light rain"}
    history = [*ASK, choice.message.model_dump(exclude_none=True), answer]
    follow = client.chat.completions.create(model="test-model", messages=history, max_tokens=8)
    assert follow.choices[0].message.content is not None


def test_required_calls_stream_whole_at_the_end(tiny_server: ServerProcess) -> None:
    stream = _client(tiny_server).chat.completions.create(
        model="test-model", messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
        max_tokens=120, temperature=1.0, seed=5, stream=True,
    )  # fmt: skip
    calls, content, finish = [], "", None
    for chunk in stream:
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    if finish == "length":
        assert not calls and content.startswith("[")
        return
    assert finish == "tool_calls" and calls and content == ""
    assert [c.index for c in calls] == list(range(len(calls)))
    for call in calls:
        assert call.id and call.function and call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments or "")
