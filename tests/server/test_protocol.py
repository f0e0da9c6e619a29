"""Request validation (types, ranges, OpenAI quirks); response shapes the openai client parses."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ValidationError

from surge.sampling_params import SamplingParams
from surge.server.errors import BadRequestError, install_error_handlers
from surge.server.protocol import (
    MAX_N,
    ChatCompletionRequest,
    CompletionRequest,
    check_context_length,
)
from surge.server.protocol_messages import TextContentPart, flatten_message_content
from surge.server.protocol_tokenize import DetokenizeRequest, TokenizeRequest

MSGS = [{"role": "user", "content": "hi"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]


def _params_dict(p: SamplingParams) -> dict[str, Any]:
    return {"temperature": p.temperature, "max_tokens": p.max_tokens, "logprobs": p.logprobs}


def make_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> dict[str, Any]:
        return _params_dict(request.to_sampling_params(room=100))

    @app.post("/v1/chat/completions")
    async def chat(request: ChatCompletionRequest) -> dict[str, Any]:
        return _params_dict(request.to_sampling_params(room=100))

    return app


async def post(path: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=make_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post(path, json=body)


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSGS, **fields}


async def test_valid_requests_and_unknown_fields_ignored() -> None:
    resp = await post("/v1/completions", completion(logit_bias={"1": 5}, whatever=[1]))
    assert resp.status_code == 200
    assert resp.json() == {"temperature": 1.0, "max_tokens": 16, "logprobs": None}
    resp = await post("/v1/chat/completions", chat(suffix="x", temperature=0))
    assert resp.json() == {"temperature": 0.0, "max_tokens": 100, "logprobs": None}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", completion(temperature="hot"), "temperature"),
        ("/v1/completions", completion(max_tokens="12"), "max_tokens"),
        ("/v1/completions", completion(n=True), "n"),
        ("/v1/completions", completion(max_tokens=1.5), "max_tokens"),
        ("/v1/completions", completion(stream="yes"), "stream"),
        ("/v1/completions", completion(stop=[1]), "stop"),
        ("/v1/completions", completion(prompt=[]), "prompt"),
        ("/v1/completions", completion(prompt=[[1], []]), "prompt"),
        ("/v1/completions", completion(prompt=[1, -2]), "prompt"),
        ("/v1/completions", completion(stream_options={"include_usage": True}), "stream_options"),
        ("/v1/chat/completions", chat(messages=[]), "messages"),
        ("/v1/chat/completions", chat(messages=[{"role": "robot", "content": "x"}]), None),
        ("/v1/chat/completions", chat(top_logprobs=2), "top_logprobs"),
        ("/v1/chat/completions", chat(logprobs=1), "logprobs"),
        ("/v1/chat/completions", chat(tools=[{"type": "function"}]), "tools.0.function"),
        ("/v1/chat/completions", chat(tool_choice="required"), "tool_choice"),
        ("/v1/chat/completions", chat(tools=TOOLS), "tool_choice"),
        ("/v1/chat/completions", chat(tools=TOOLS, tool_choice="auto"), "tool_choice"),
        (
            "/v1/chat/completions",
            chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
            "tool_choice",
        ),
        (
            "/v1/chat/completions",
            chat(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}),
            "tool_choice",
        ),
        ("/v1/chat/completions", chat(functions=[{"name": "f"}]), "functions"),
        ("/v1/chat/completions", chat(response_format={"type": "xml"}), None),
        ("/v1/chat/completions", chat(response_format={"type": "json_schema"}), "response_format"),
        ("/v1/completions", completion(guided_regex="[a-"), "guided_regex"),
        ("/v1/completions", completion(guided_json='{"type": "wat"}'), "guided_json"),
        ("/v1/completions", completion(guided_choice=[]), "guided_choice"),
        (
            "/v1/completions",
            completion(structured_outputs={"grammar": "start: x"}),
            "structured_outputs.grammar",
        ),
        (
            "/v1/chat/completions",
            chat(response_format={"type": "json_object"}, guided_regex="[0-9]+"),
            "guided_regex",
        ),
    ],
)
async def test_wrong_types_and_shapes_are_400(
    path: str, body: dict[str, Any], param: str | None
) -> None:
    resp = await post(path, body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param
        assert err["message"].startswith(f"{param}: ")


async def test_bad_role_and_response_format_messages() -> None:
    resp = await post("/v1/chat/completions", chat(messages=[{"role": "robot", "content": "x"}]))
    assert resp.json()["error"]["param"] == "messages.0.role"
    resp = await post("/v1/completions", completion(guided_regex="[a-"))
    err = resp.json()["error"]
    assert (
        "the regex is not valid" in err["message"] and "unclosed character class" in err["message"]
    )
    resp = await post("/v1/chat/completions", chat(tools=TOOLS))
    assert "'auto' (the default with tools) needs a parser" in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", completion(temperature=-1), "temperature"),
        ("/v1/completions", completion(top_p=0), "top_p"),
        ("/v1/completions", completion(n=0), "n"),
        ("/v1/completions", completion(n=MAX_N + 1), "n"),
        ("/v1/completions", completion(logprobs=21), "logprobs"),
        ("/v1/completions", completion(max_tokens=0), "max_tokens"),
        ("/v1/completions", completion(min_tokens=20), "min_tokens"),
        ("/v1/completions", completion(presence_penalty=3), "presence_penalty"),
        ("/v1/completions", completion(stop=[""]), "stop"),
        ("/v1/completions", completion(stop_token_ids=[-1]), "stop_token_ids"),
        ("/v1/chat/completions", chat(logprobs=True, top_logprobs=21), "top_logprobs"),
        (
            "/v1/chat/completions",
            chat(max_completion_tokens=0, max_tokens=5),
            "max_completion_tokens",
        ),
        ("/v1/chat/completions", chat(max_tokens=0), "max_tokens"),
        ("/v1/chat/completions", chat(repetition_penalty=0), "repetition_penalty"),
        ("/v1/chat/completions", chat(top_k=-2), "top_k"),
    ],
)
async def test_out_of_range_values_are_400_naming_the_param(
    path: str, body: dict[str, Any], param: str
) -> None:
    resp = await post(path, body)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param
    assert err["message"].startswith(param + " "), err["message"]


def test_n_bound_is_stated() -> None:
    with pytest.raises(BadRequestError, match=rf"n must be between 1 and {MAX_N}, got 17"):
        CompletionRequest(prompt="x", n=17).to_sampling_params(room=10)


def test_null_means_default() -> None:
    req = ChatCompletionRequest.model_validate(
        chat(n=None, stream=None, logprobs=None, temperature=None, max_tokens=None)
    )
    assert (req.n, req.stream, req.logprobs) == (1, False, False)
    assert req.to_sampling_params(room=7).max_tokens == 7
    req2 = CompletionRequest.model_validate(completion(max_tokens=None))
    assert req2.to_sampling_params(room=42).max_tokens == 42


def test_chat_mapping_to_sampling_params() -> None:
    req = ChatCompletionRequest.model_validate(
        chat(max_tokens=5, max_completion_tokens=9, logprobs=True, top_logprobs=3, seed=4,
             stop="x", stop_token_ids=[2], top_k=5, min_p=0.1, ignore_eos=True, n=2)
    )  # fmt: skip
    p = req.to_sampling_params(room=100)
    assert (p.max_tokens, p.logprobs, p.seed, p.stop, p.stop_token_ids) == (9, 3, 4, ("x",), (2,))
    assert (p.top_k, p.min_p, p.ignore_eos, p.n) == (5, 0.1, True, 2)
    assert (
        ChatCompletionRequest.model_validate(chat(logprobs=True))
        .to_sampling_params(room=1)
        .logprobs
        == 0
    )
    assert ChatCompletionRequest.model_validate(chat()).to_sampling_params(room=1).logprobs is None


def test_completion_prompt_forms_and_logprobs() -> None:
    assert CompletionRequest(prompt="a").prompt_list() == ["a"]
    assert CompletionRequest(prompt=["a", "b"]).prompt_list() == ["a", "b"]
    assert CompletionRequest(prompt=[1, 2]).prompt_list() == [[1, 2]]
    assert CompletionRequest(prompt=[[1], [2, 3]]).prompt_list() == [[1], [2, 3]]
    assert CompletionRequest(prompt="a", logprobs=5).to_sampling_params(room=1).logprobs == 5
    assert CompletionRequest(prompt="a", temperature=1).temperature == 1.0


def test_include_usage() -> None:
    assert not CompletionRequest(prompt="a", stream=True).include_usage
    on = {"stream": True, "stream_options": {"include_usage": True}}
    assert CompletionRequest.model_validate(completion(**on)).include_usage


def test_flatten_and_template_messages() -> None:
    parts: list[Any] = [TextContentPart(type="text", text="a"), {"type": "text", "text": "b"}]
    assert flatten_message_content(parts) == "a\nb"
    assert flatten_message_content(None) == "" and flatten_message_content("x") == "x"
    req = ChatCompletionRequest.model_validate(
        chat(messages=[{"role": "system", "content": [{"type": "text", "text": "s"}], "name": "n"}])
    )
    assert req.template_messages() == [{"role": "system", "content": "s", "name": "n"}]
    # An assistant turn sent back as a reasoning parser answered it: its thinking reaches the
    # template under both names (Qwen3's template reads reasoning_content).
    turn = {"role": "assistant", "content": "4", "reasoning": "2+2"}
    rendered = ChatCompletionRequest.model_validate(chat(messages=[turn])).template_messages()
    assert rendered[0]["reasoning_content"] == rendered[0]["reasoning"] == "2+2"
    with pytest.raises(ValidationError, match="only text is supported"):
        ChatCompletionRequest.model_validate(
            chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
        )


def test_tokenize_and_detokenize_requests() -> None:
    assert TokenizeRequest(prompt="x").wants_special_tokens()
    chat_tok = TokenizeRequest.model_validate({"messages": MSGS})
    assert not chat_tok.wants_special_tokens() and chat_tok.add_generation_prompt
    bad_bodies: list[dict[str, Any]] = [{}, {"prompt": "x", "messages": MSGS}, {"messages": []}]
    for bad in bad_bodies:
        with pytest.raises(ValidationError):
            TokenizeRequest.model_validate(bad)
    assert DetokenizeRequest(tokens=[1, 2]).tokens == [1, 2]
    with pytest.raises(ValidationError):
        DetokenizeRequest.model_validate({"tokens": [-1]})


def test_check_context_length() -> None:
    check_context_length(10, 20, 30)
    check_context_length(10, None, 30)
    with pytest.raises(BadRequestError) as info:
        check_context_length(10, 21, 30)
    assert info.value.param == "max_tokens" and info.value.code == "context_length_exceeded"
    with pytest.raises(BadRequestError) as info:
        check_context_length(30, None, 30, param="prompt")
    assert info.value.param == "prompt"


def test_requests_json_roundtrip_through_openai_sdk_shapes() -> None:
    # A body exactly as the openai client serialises it parses without complaint.
    body = json.loads(
        '{"model": "m", "messages": [{"role": "developer", "content": "d"}, {"role": "user",'
        ' "content": "u"}], "max_completion_tokens": 8, "stream": true,'
        ' "stream_options": {"include_usage": true}, "temperature": 0.7, "top_p": 0.9,'
        ' "stop": ["\\n"], "seed": 1, "user": "u1", "logprobs": true, "top_logprobs": 2}'
    )
    req = ChatCompletionRequest.model_validate(body)
    assert req.include_usage and req.to_sampling_params(room=100).max_tokens == 8


def _dump(model: Any) -> Any:
    return json.loads(model.model_dump_json())


def test_response_shapes_parse_with_openai_client() -> None:
    from surge.server.protocol_responses import (
        ChatChoiceLogProbs,
        ChatCompletionChoice,
        ChatCompletionResponse,
        ChatLogProb,
        ChatLogProbsContent,
        ChatResponseMessage,
        CompletionChoice,
        CompletionLogProbs,
        CompletionResponse,
        UsageInfo,
    )

    usage = UsageInfo.of(3, 2, cached_tokens=1)
    assert usage.total_tokens == 5
    lp = CompletionLogProbs(
        tokens=["a", "b"], token_logprobs=[-0.2, -0.5], top_logprobs=[{"a": -0.2}, {"b": -0.5}],
        text_offset=[0, 1],
    )  # fmt: skip
    choice = CompletionChoice(index=0, text="ab", logprobs=lp, finish_reason="stop")
    data = _dump(CompletionResponse(model="m", choices=[choice], usage=usage))
    assert data["id"].startswith("cmpl-") and data["object"] == "text_completion"
    assert data["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}
    parsed_lp = Completion.model_validate(data).choices[0].logprobs
    assert parsed_lp is not None and parsed_lp.token_logprobs == [-0.2, -0.5]
    # An echoed first prompt token has no logprob: null, as OpenAI and vLLM send it.
    echo = CompletionLogProbs(tokens=["a"], token_logprobs=[None], top_logprobs=[None])
    assert _dump(echo)["token_logprobs"] == [None]

    top = ChatLogProb(token="b", logprob=-0.1, bytes=[98])
    chat_resp = ChatCompletionResponse(
        model="m",
        choices=[
            ChatCompletionChoice(
                index=0,
                message=ChatResponseMessage(content="b"),
                logprobs=ChatChoiceLogProbs(
                    content=[
                        ChatLogProbsContent(token="b", logprob=-0.1, bytes=[98], top_logprobs=[top])
                    ]
                ),
                finish_reason="length",
            )
        ],
        usage=UsageInfo.of(1, 1),
    )
    data = _dump(chat_resp)
    assert data["id"].startswith("chatcmpl-") and data["object"] == "chat.completion"
    parsed = ChatCompletion.model_validate(data)
    assert parsed.choices[0].message.content == "b" and parsed.choices[0].finish_reason == "length"
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "b"}


def test_stream_chunks_match_openai_wire_format() -> None:
    from surge.server.protocol_responses import (
        SSE_DONE,
        ChatCompletionStreamChoice,
        ChatCompletionStreamResponse,
        CompletionChoice,
        CompletionStreamResponse,
        DeltaMessage,
        UsageInfo,
    )

    delta = DeltaMessage(role="assistant", content="")
    first = ChatCompletionStreamResponse(
        id="chatcmpl-1",
        created=1,
        model="m",
        choices=[ChatCompletionStreamChoice(index=0, delta=delta)],
    )
    event = first.to_sse(include_usage=True)
    assert event.startswith("data: ") and event.endswith("\n\n")
    data = json.loads(event[len("data: ") :])
    assert data == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}
        ],
        "usage": None,
    }  # fmt: skip
    ChatCompletionChunk.model_validate(data)
    last = ChatCompletionStreamResponse(
        id="chatcmpl-1", created=1, model="m",
        choices=[ChatCompletionStreamChoice(index=0, finish_reason="stop")],
    )  # fmt: skip
    data = json.loads(last.to_sse(include_usage=False)[len("data: ") :])
    assert "usage" not in data and data["choices"][0]["delta"] == {}
    assert ChatCompletionChunk.model_validate(data).choices[0].finish_reason == "stop"
    usage_chunk = ChatCompletionStreamResponse(id="c", model="m", usage=UsageInfo.of(2, 3))
    data = json.loads(usage_chunk.to_sse(include_usage=True)[len("data: ") :])
    assert data["choices"] == [] and data["usage"]["total_tokens"] == 5
    assert ChatCompletionChunk.model_validate(data).usage.completion_tokens == 3  # type: ignore[union-attr]

    text = CompletionStreamResponse(
        id="cmpl-1", model="m", choices=[CompletionChoice(index=0, text="x")]
    )
    data = json.loads(text.to_sse(include_usage=False)[len("data: ") :])
    assert data["choices"] == [{"index": 0, "text": "x", "logprobs": None, "finish_reason": None}]
    assert SSE_DONE == "data: [DONE]\n\n"


def test_model_list_and_tokenize_responses() -> None:
    from openai.types import Model

    from surge.server.protocol_responses import ModelCard, ModelList, TokenizeResponse

    data = _dump(ModelList(data=[ModelCard(id="smollm2", max_model_len=2048)]))
    assert data["object"] == "list"
    card = data["data"][0]
    assert card["owned_by"] == "surge" and card["max_model_len"] == 2048
    assert Model.model_validate(card).id == "smollm2"
    assert _dump(TokenizeResponse(count=2, max_model_len=8, tokens=[1, 2])) == {
        "count": 2,
        "max_model_len": 8,
        "tokens": [1, 2],
    }


@pytest.mark.parametrize(
    ("fields", "kind", "spec"),
    [
        ({"response_format": {"type": "text"}}, None, None),
        ({"response_format": {"type": "json_object"}}, "json_object", ""),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "schema": {"type": "integer"}},
                }
            },
            "json",
            '{"type": "integer"}',
        ),
        ({"guided_json": {"type": "string"}}, "json", '{"type": "string"}'),
        ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
        ({"guided_choice": ["yes", "no"]}, "choice", '["yes", "no"]'),
        ({"guided_grammar": 'start: "a"+'}, "grammar", 'start: "a"+'),
        ({"structured_outputs": {"json": {"type": "string"}}}, "json", '{"type": "string"}'),
        ({"structured_outputs": {"choice": ["x"]}}, "choice", '["x"]'),
        ({"structured_outputs": {"json_object": True}}, "json_object", ""),
    ],
)
def test_structured_output_forms(
    fields: dict[str, Any], kind: str | None, spec: str | None
) -> None:
    for req in (ChatCompletionRequest.model_validate(chat(**fields)),
                CompletionRequest.model_validate(completion(**fields))):  # fmt: skip
        structured = req.to_sampling_params(room=10).structured
        if kind is None:
            assert structured is None
        else:
            assert structured is not None and (structured.kind, structured.spec) == (kind, spec)


def test_tool_choice_forms() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, kind in ((named, "json"), ("required", "json"), ("none", None)):
        req = ChatCompletionRequest.model_validate(chat(tools=TOOLS, tool_choice=choice))
        structured = req.to_sampling_params(room=10).structured
        assert (structured and structured.kind) == kind
    req = ChatCompletionRequest.model_validate(chat(tools=TOOLS, tool_choice=named))
    plan = req.tool_plan()
    assert plan is not None and plan.named == "get_weather"
    assert (
        json.loads(req.to_sampling_params(room=10).structured.spec)
        == (  # type: ignore[union-attr]
            TOOLS[0]["function"]["parameters"]  # type: ignore[index]
        )
    )
    content, calls = plan.answer('{"city": "Oslo"}')
    assert content is None and calls[0].to_openai()["function"] == {
        "name": "get_weather", "arguments": '{"city": "Oslo"}'}  # fmt: skip
    required = ChatCompletionRequest.model_validate(chat(tools=TOOLS, tool_choice="required"))
    plan = required.tool_plan()
    assert plan is not None
    content, calls = plan.answer('[{"name": "get_weather", "parameters": {"city": "Rome"}}]')
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Rome"})]  # fmt: skip
    assert plan.answer('[{"name": "get_wea') == ('[{"name": "get_wea', [])  # cut: text
    assert plan.finish_reason("stop") == "tool_calls" and plan.finish_reason("length") == "length"
    # An earlier turn's calls and a tool's answer are accepted and reach the template.
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [calls[0].to_openai()]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "12 C"},
    ]
    req = ChatCompletionRequest.model_validate(chat(messages=history))
    rendered = req.template_messages()
    assert rendered[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert rendered[2]["tool_call_id"] == calls[0].id
