"""The OpenAI API through the official client against a real server (tiny model, fp32)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.servers import ServerProcess


@pytest.fixture(scope="module")
def client(tiny_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0)


def test_models_health_version(tiny_server: ServerProcess, client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["test-model"]
    assert httpx.get(tiny_server.url + "/health").json() == {"status": "ok"}
    assert "version" in httpx.get(tiny_server.url + "/version").json()
    card = client.models.retrieve("test-model")
    assert card.id == "test-model" and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_continuous_usage_stats(tiny_server: ServerProcess) -> None:
    """vLLM's stream_options.continuous_usage_stats: the usage so far in every chunk."""
    hi = [{"role": "user", "content": "Hi"}]
    for path, body in (("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/chat/completions", {"messages": hi})):  # fmt: skip
        r = httpx.post(tiny_server.url + path, timeout=30, json={
            **body, "max_tokens": 5, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})  # fmt: skip
        chunks = [json.loads(ln[6:]) for ln in r.text.splitlines()
                  if ln.startswith("data: {")]  # fmt: skip
        done = [c["usage"]["completion_tokens"] for c in chunks]
        assert done == sorted(done) and done[-1] == 5, done
        assert all(c["usage"]["prompt_tokens"] > 0 for c in chunks)


def test_completion_stream_equals_non_stream(client: openai.OpenAI) -> None:
    kwargs = {"model": "test-model", "prompt": "The quick brown fox", "max_tokens": 20}
    full = client.completions.create(**kwargs, temperature=0)
    assert full.choices[0].finish_reason in ("stop", "length")
    assert full.usage is not None and full.usage.prompt_tokens == 4
    assert full.usage.completion_tokens > 0
    stream = client.completions.create(
        **kwargs, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    full = client.chat.completions.create(
        model="test-model",
        messages=messages,
        max_tokens=16,
        temperature=0,  # type: ignore[arg-type]
    )
    assert full.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="test-model",
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    pieces, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(pieces) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason


def test_n_seed_and_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="test-model", prompt="Once upon a time", max_tokens=8, n=3, temperature=1.0,
        seed=11, logprobs=2,
    )  # fmt: skip
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1
    again = client.completions.create(
        model="test-model", prompt="Once upon a time", max_tokens=8, n=3, temperature=1.0,
        seed=11, logprobs=2,
    )  # fmt: skip
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == 8
    assert all(len(t) == 2 for t in lp.top_logprobs or [])
    assert r.usage is not None and r.usage.completion_tokens == 24


def test_chat_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="test-model", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        temperature=0, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    for item in content:
        assert len(item.top_logprobs) == 3
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)


def test_stop_string_not_emitted(client: openai.OpenAI) -> None:
    base = client.completions.create(
        model="test-model", prompt="Hello", max_tokens=20, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    text = base.choices[0].text
    stop = text[6:10]
    r = client.completions.create(
        model="test-model", prompt="Hello", max_tokens=20, temperature=0, stop=[stop],
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert r.choices[0].text == text[: text.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_prompt_list_and_token_ids(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="test-model", prompt=["Hello", "Goodbye"], max_tokens=4, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1]
    single = client.completions.create(
        model="test-model", prompt="Goodbye", max_tokens=4, temperature=0
    )
    assert r.choices[1].text == single.choices[0].text
    ids = client.completions.create(model="test-model", prompt=[19556], max_tokens=3, temperature=0)
    assert ids.usage is not None and ids.usage.prompt_tokens == 1


def test_echo_and_vllm_extras(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="test-model", prompt="Hello there", max_tokens=6, temperature=0, echo=True,
        extra_body={"min_tokens": 6, "ignore_eos": True, "top_k": 5, "min_p": 0.01,
                    "repetition_penalty": 1.1, "priority": 0},
    )  # fmt: skip
    assert r.choices[0].text.startswith("Hello there")
    assert r.usage is not None and r.usage.completion_tokens == 6


def test_tokenize_detokenize(tiny_server: ServerProcess) -> None:
    t = httpx.post(tiny_server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] > 0
    d = httpx.post(tiny_server.url + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert d["prompt"] == "Hello world"


def test_metrics_use_vllm_names(tiny_server: ServerProcess, client: openai.OpenAI) -> None:
    client.completions.create(model="test-model", prompt="count", max_tokens=3, temperature=0)
    assert tiny_server.metric("vllm:generation_tokens_total") > 0
    assert tiny_server.metric("vllm:prompt_tokens_total") > 0
    assert tiny_server.metric("vllm:time_to_first_token_seconds_count") > 0
    assert tiny_server.metric("vllm:e2e_request_latency_seconds_count") > 0
    assert tiny_server.metric("vllm:num_requests_running") == 0
    assert tiny_server.metric("vllm:kv_cache_usage_perc") == 0.0
    assert tiny_server.metric("vllm:engine_healthy") == 1.0
    assert tiny_server.metric("vllm:iteration_tokens_total_count") > 1  # every step, not the last


def test_each_answer_carries_the_request_id(tiny_server: ServerProcess) -> None:
    """X-Request-Id comes back as sent (errors too), or made when none was sent."""
    url = tiny_server.url
    body = {"model": "test-model", "prompt": "Hi", "max_tokens": 2}
    r = httpx.post(url + "/v1/completions", json=body, headers={"X-Request-Id": "abc-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc-1"
    bad = httpx.post(url + "/v1/completions", json={**body, "max_tokens": -1},
                     headers={"x-request-id": "abc-2"})  # fmt: skip
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "abc-2"
    made = httpx.get(url + "/v1/models").headers["x-request-id"]
    assert len(made) == 32 and made != httpx.get(url + "/v1/models").headers["x-request-id"]
