"""logit_bias (OpenAI), allowed_token_ids and bad_words (vLLM) through HTTP with the official
`openai` client, on the tiny random model: what it writes can only follow from the rules."""

from __future__ import annotations

import re

import httpx
import openai

from tests.servers import ServerProcess


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _ids(server: ServerProcess, text: str) -> list[int]:
    tokens: list[int] = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"]
    return tokens


def test_logit_bias_and_allowed_token_ids_hold_sampled_text(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    cat, dog = _ids(tiny_server, " cat dog")
    forced = client.completions.create(
        model="test-model", prompt="Hello", max_tokens=6, temperature=1.0, seed=1,
        logit_bias={str(cat): 100},
    )  # fmt: skip
    assert forced.choices[0].text == " cat" * 6
    chat = client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "Pets?"}], max_tokens=8,
        temperature=1.0, seed=2, extra_body={"allowed_token_ids": [cat, dog]},
    )  # fmt: skip
    text = chat.choices[0].message.content or ""
    assert re.fullmatch("( cat| dog){8}", text), text


def test_bad_words_are_never_written(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    kwargs = {"model": "test-model", "prompt": "The", "max_tokens": 12, "temperature": 0.0,
              "logprobs": 0}  # fmt: skip
    first = client.completions.create(**kwargs)  # type: ignore[call-overload]
    tokens = first.choices[0].logprobs.tokens
    word = next(t for t in tokens if re.fullmatch(r" [A-Za-z]+", t))
    again = client.completions.create(**kwargs, extra_body={"bad_words": [word.strip()]})  # type: ignore[call-overload]
    assert word not in again.choices[0].logprobs.tokens
    assert again.choices[0].text != first.choices[0].text
