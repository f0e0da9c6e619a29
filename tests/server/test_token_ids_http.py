"""vLLM's return_token_ids (the prompt's and each choice's token ids, whole and streamed: what
RL trainers need to score the very tokens sampled) and return_tokens_as_token_ids (logprobs'
tokens named "token_id:{id}"), through the official `openai` client."""

from __future__ import annotations

import httpx
import openai

from tests.servers import ServerProcess

MESSAGES = [{"role": "user", "content": "Count: one two three"}]


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_chat_returns_the_token_ids_whole_and_streamed(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    common = {"model": "test-model", "messages": MESSAGES, "max_tokens": 12, "temperature": 0.0}
    extra = {"return_token_ids": True, "return_tokens_as_token_ids": True}
    whole = client.chat.completions.create(logprobs=True, top_logprobs=2, extra_body=extra,
                                           **common)  # type: ignore[call-overload]  # fmt: skip
    body = whole.model_dump()
    prompt = httpx.post(tiny_server.url + "/tokenize", json={"messages": MESSAGES}).json()
    assert body["prompt_token_ids"] == prompt["tokens"]
    ids = body["choices"][0]["token_ids"]
    assert len(ids) == whole.usage.completion_tokens  # type: ignore[union-attr]
    detok = httpx.post(tiny_server.url + "/detokenize", json={"tokens": ids}).json()
    assert detok["prompt"] == whole.choices[0].message.content
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert [c.token for c in content] == [f"token_id:{t}" for t in ids]
    assert all(top.token.startswith("token_id:") for top in content[0].top_logprobs)
    chunks = [c.model_dump() for c in client.chat.completions.create(
        stream=True, extra_body={"return_token_ids": True}, **common)]  # type: ignore[call-overload]  # fmt: skip
    assert chunks[0]["prompt_token_ids"] == body["prompt_token_ids"]
    streamed = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids") or []]
    assert streamed == ids
    plain = client.chat.completions.create(**common).model_dump()  # type: ignore[call-overload]
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_completions_return_each_choices_token_ids(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    common = {"model": "test-model", "prompt": ["Hello there", "One two"], "max_tokens": 6,
              "temperature": 0.0, "extra_body": {"return_token_ids": True}}  # fmt: skip
    whole = client.completions.create(**common).model_dump()  # type: ignore[call-overload]
    hello = httpx.post(tiny_server.url + "/tokenize", json={"prompt": "Hello there"}).json()
    assert whole["choices"][0]["prompt_token_ids"] == hello["tokens"]
    assert [len(c["token_ids"]) for c in whole["choices"]] == [6, 6]
    chunks = [c.model_dump() for c in client.completions.create(stream=True, **common)]  # type: ignore[call-overload]
    for i in (0, 1):
        mine = [ch for c in chunks for ch in c["choices"] if ch["index"] == i]
        assert mine[0]["prompt_token_ids"] == whole["choices"][i]["prompt_token_ids"]
        assert all(ch.get("prompt_token_ids") is None for ch in mine[1:])
        got = [t for ch in mine for t in ch.get("token_ids") or []]
        assert got == whole["choices"][i]["token_ids"]
