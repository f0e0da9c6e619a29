"""Tool-call parsers for tool_choice "auto": what they read from finished outputs, and that a
stream fed the text a character at a time sends exactly the finished answer, nothing taken back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from surge.server.tool_parsers import PARSERS, ToolCallStream, ToolParser, parser_for_template
from surge.server.tool_parsers.prompt import renders_tools, with_tools_prompt

TOOLS = ["get_weather", "get_time"]


def _stream(parser: ToolParser, text: str, step: int = 1) -> tuple[str, list[dict[str, Any]]]:
    """Content and calls as a client assembles them from the deltas of a growing text."""
    stream = ToolCallStream(parser)
    content, calls = "", []
    cuts = [*range(step, len(text), step), len(text)]
    for n in cuts:
        piece, deltas = stream.update(text[:n], final=n == len(text))
        content += piece
        for d in deltas:
            if "id" in d:
                assert d["index"] == len(calls) and d["type"] == "function"
                calls.append({"id": d["id"], "name": d["function"]["name"], "arguments": ""})
            else:
                assert "name" not in d["function"]
            calls[d["index"]]["arguments"] += d["function"]["arguments"]
    assert stream.called == bool(calls)
    return content, calls


def _check(name: str, text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    parser = PARSERS[name](TOOLS)
    got_content, got_calls = parser.answer(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls
    assert all(c.id.startswith("call_") for c in got_calls)
    for step in (1, 3, 7):
        streamed, streamed_calls = _stream(parser, text, step)
        assert streamed == (content or ""), (step, streamed)
        assert [(c["name"], c["arguments"]) for c in streamed_calls] == [
            (c.name, c.arguments) for c in got_calls
        ]


WEATHER = ("get_weather", {"city": "Paris", "note": 'a } and a " and </tool_call>'})


@pytest.mark.parametrize(
    ("name", "text", "content", "calls"),
    [
        ("hermes", "Just text, < not a call.", "Just text, < not a call.", []),
        (
            "hermes",
            'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
            '"note": "a } and a \\" and </tool_call>"}}\n</tool_call>\n<tool_call>\n'
            '{"name": "get_time", "arguments": {}}\n</tool_call>',
            "Let me look.\n",
            [WEATHER, ("get_time", {})],
        ),
        # Arguments written as a JSON string, keys in another order, a call cut by the end.
        ("hermes", '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}',
         None, [("get_time", {"zone": "CET"})]),
        ("hermes", '<tool_call>{"arguments": {"zone": "UTC"}, "name": "get_time"}</tool_call>',
         None, [("get_time", {"zone": "UTC"})]),
        ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
         '{"name": "get_time", "parameters": {"zone": "CET"}}', None,
         [("get_weather", {"city": "Oslo"}), ("get_time", {"zone": "CET"})]),
        ("llama3_json", '{"name": "get_time", "parameters": {}}', None, [("get_time", {})]),
        ("llama3_json", "The weather is fine.", "The weather is fine.", []),
        ("llama3_json", '{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', []),
        ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
         '{"name": "get_time", "arguments": {}}]', None,
         [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
        # [TOOL_CALLS] is a control token, dropped when the text is decoded.
        ("mistral", '[{"name": "get_time", "arguments": {"zone": "CET"}}]', None,
         [("get_time", {"zone": "CET"})]),
        ("mistral", "[1, 2] are numbers", "[1, 2] are numbers", []),
        ("mistral", "Plain words.", "Plain words.", []),
        ("pythonic", '[get_weather(city="Paris", days=2), get_time()]', None,
         [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]),
        ("pythonic", "[1, 2] are numbers", "[1, 2] are numbers", []),
        ("pythonic", "[unknown_tool(x=1)]", "[unknown_tool(x=1)]", []),
    ],
)  # fmt: skip
def test_parsers_read_calls_and_stream_the_same(
    name: str, text: str, content: str | None, calls: list[tuple[str, Any]]
) -> None:
    _check(name, text, content, calls)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "get_weather", "arguments": {"city": ',  # cut by max_tokens
        '<tool_call>{"name": get_weather}</tool_call>',  # not JSON
    ],
)
def test_a_malformed_call_is_the_answer_as_text(text: str) -> None:
    parser = PARSERS["hermes"](TOOLS)
    assert parser.answer(text) == (text, [])


def test_a_stream_holds_back_what_may_start_a_call() -> None:
    stream = ToolCallStream(PARSERS["hermes"](TOOLS))
    assert stream.update("Hi <tool_", final=False) == ("Hi ", [])
    assert stream.update("Hi <tool_c", final=False) == ("", [])
    # It was not a call after all: the held text goes out.
    assert stream.update("Hi <tool_cat>", final=False) == ("<tool_cat>", [])
    content, deltas = stream.update('Hi <tool_cat><tool_call>{"name": "get_time"', final=False)
    assert content == "" and deltas[0]["function"] == {"name": "get_time", "arguments": ""}
    # A malformed call already sent stays sent: the stream ends without taking it back.
    assert stream.update('Hi <tool_cat><tool_call>{"name": "get_time"!', final=True) == ("", [])
    assert stream.called


def test_template_detection_and_the_prompt_for_templates_without_tools() -> None:
    assert parser_for_template("{{ '<tool_call>' }} {% if tools %}").name == "hermes"
    assert parser_for_template("<|python_tag|>{{ tools }}").name == "llama3_json"
    assert parser_for_template("[func_name1(params_name1=params_value1)] {{ tools }}").name == (
        "pythonic"
    )
    assert parser_for_template("[AVAILABLE_TOOLS] {{ tools }}").name == "mistral"
    assert parser_for_template(None).name == "hermes"
    cut = '[TOOL_CALLS][{"name": "get_time", "arguments": {}}'  # the list never closed
    assert PARSERS["mistral"](TOOLS).answer(cut) == (cut, [])
    assert renders_tools("{% if tools %}") and not renders_tools("{{ messages }}")
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    messages = [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]  # fmt: skip
    out = with_tools_prompt(PARSERS["hermes"](TOOLS), messages, [tool])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert '<tools>\n{"type": "function"' in out[0]["content"]
    # The earlier call, as the model writes one, reads back as the same call.
    assert PARSERS["hermes"](TOOLS).answer(out[2]["content"])[1][0].arguments == '{"zone": "CET"}'
    assert out[3]["content"] == "<tool_response>\n12:00\n</tool_response>"
    system = with_tools_prompt(PARSERS["pythonic"](TOOLS), [{"role": "system", "content": "Be"}],
                               [tool])  # fmt: skip
    assert len(system) == 1 and system[0]["content"].startswith("Be\n\nYou can call functions")
