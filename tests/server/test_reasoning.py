"""--reasoning-parser: a reasoning model's <think>...</think> read apart from its answer, whole
and streamed (the same split either way, however the text is cut), through chat and the
Responses API; on a tiny model's server (qwen3 parser), its output held to a thinking shape by a
regex; a JSON constraint holds after any thinking."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from surge.server.reasoning import PARSERS, ReasoningStream
from tests.servers import ServerProcess

TEXTS = ["<think>\nhmm, 2+2</think>\n\nIt is 4.", "It is 4.", "hmm</think>\n\n4", "<thx",
         "  <think>abc </thi", "<think>never closed", "", "<think>  </think>  \n", "  ",
         "\n<think></think>4 </think> 5", "<think> a <b</think></think>", " x<think>y"]  # fmt: skip


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("prompt_opens", [False, True])
def test_a_stream_splits_as_the_whole_text_does(name: str, prompt_opens: bool) -> None:
    parser = PARSERS[name]
    for text in TEXTS:
        for step in (1, 3):
            stream = ReasoningStream(parser, prompt_opens)
            sent = ["", ""]
            for end in [*range(step, len(text), step), len(text)]:
                final = end == len(text)
                new = stream.update(text[:end], final)
                sent = [sent[0] + new[0], sent[1] + new[1]]
                assert tuple(sent) == parser.split(text[:end], final, prompt_opens), (text, end)
                assert stream.content == sent[1]
            assert tuple(sent) == parser.split(text, True, prompt_opens), (text, step)


def test_what_each_parser_reads() -> None:
    qwen3, r1 = PARSERS["qwen3"], PARSERS["deepseek_r1"]
    assert qwen3.split(TEXTS[0], True) == r1.split(TEXTS[0], True) == ("hmm, 2+2", "It is 4.")
    assert qwen3.split("It is 4.", True) == ("", "It is 4.")  # no thinking opened: an answer
    assert qwen3.split("hmm</think>\n\n4", True, prompt_opens=True) == ("hmm", "4")
    assert r1.split("hmm</think>\n\n4", True) == ("hmm", "4")  # R1 starts thinking untagged
    assert r1.split("still thinking", True) == ("still thinking", "")
    assert qwen3.split("<thi", False) == ("", "")  # maybe a tag: held back until known


@pytest.fixture(scope="module")
def thinking_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tiny_model_dir, "--dtype", "float32", "--reasoning-parser", "qwen3")
    yield server
    server.stop()


THINK = r"<think>[a-z]{2,6}( [a-z]{2,6}){1,3}</think>\n\n[a-z]{2,6}( [a-z]{2,6}){0,2}"


def test_chat_and_responses_carry_the_reasoning_apart(thinking_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=thinking_server.url + "/v1", api_key="none", max_retries=0)
    ask = {"model": "test-model", "messages": [{"role": "user", "content": "Think first."}],
           "max_tokens": 60, "temperature": 0.0,
           "extra_body": {"structured_outputs": {"regex": THINK}}}  # fmt: skip
    whole = client.chat.completions.create(**ask).choices[0]  # type: ignore[call-overload]
    assert whole.finish_reason == "stop"
    thought, answer = whole.message.reasoning, whole.message.content  # type: ignore[attr-defined]
    assert thought and " " in thought and "<think>" not in thought and "</think>" not in thought
    assert answer and "think" not in answer and not answer.startswith("\n")
    chunks = list(client.chat.completions.create(**ask, stream=True))  # type: ignore[call-overload]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == answer
    # The Responses API: a reasoning item, then the message.
    same = {"model": "test-model", "input": "Think first.", "max_output_tokens": 60,
            "temperature": 0.0, "extra_body": {"structured_outputs": {"regex": THINK}}}  # fmt: skip
    resp = client.responses.create(**same)  # type: ignore[call-overload]
    assert [o.type for o in resp.output] == ["reasoning", "message"]
    assert resp.output[0].content[0].text == thought  # type: ignore[union-attr,index]
    assert resp.output_text == answer
    events = list(client.responses.create(**same, stream=True))  # type: ignore[call-overload]
    pieces = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert pieces == thought and [o.type for o in final.output] == ["reasoning", "message"]
    assert final.output_text == answer


def test_a_json_answer_holds_after_any_thinking(thinking_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=thinking_server.url + "/v1", api_key="none", max_retries=0)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}  # fmt: skip
    resp = client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "A number?"}], n=6,
        max_tokens=60, temperature=1.0, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )  # fmt: skip
    done = [c for c in resp.choices if c.finish_reason == "stop"]
    assert done
    for c in done:  # the thinking (if any) apart, the content is the schema's JSON
        assert isinstance(json.loads(c.message.content or "")["n"], int), c.message
