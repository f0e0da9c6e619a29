"""/v1/embeddings on a real server (tiny Llama + the real all-MiniLM-L6-v2), through the official
`openai` client: vectors equal to the model's run offline, concurrent requests sharing batches,
bad input and overload in the OpenAI error shape."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from surge.models.embedding import EmbeddingModel
from tests.servers import ServerProcess

NAME = "test-embed"
QUEUE = 64


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, minilm_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tiny_model_dir, "--dtype", "float32",
        "--embedding-model", str(minilm_path), "--embedding-model-name", NAME,
        "--embedding-max-queue-size", str(QUEUE), "--embedding-max-queue-delay-ms", "5",
    )  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def offline(minilm_path: Path) -> EmbeddingModel:
    return EmbeddingModel.load(minilm_path)


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_vectors_equal_the_model_offline_in_base64_and_float(
    server: ServerProcess, offline: EmbeddingModel
) -> None:
    texts = ["A man is eating food.", "The girl is carrying a baby.", "Hello"]
    expected = np.array(offline.embed([offline.tokenize(t) for t in texts]))
    client = _client(server)
    default = client.embeddings.create(model=NAME, input=texts)  # the client asks for base64
    floats = client.embeddings.create(model=NAME, input=texts, encoding_format="float")
    for resp in (default, floats):
        assert resp.model == NAME and [d.index for d in resp.data] == [0, 1, 2]
        got = np.array([d.embedding for d in resp.data])
        np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    assert floats.usage.prompt_tokens == sum(len(offline.tokenize(t)) for t in texts)
    single = client.embeddings.create(model=NAME, input=texts[0])
    np.testing.assert_allclose(single.data[0].embedding, expected[0], atol=1e-6, rtol=0)


def test_token_id_inputs_are_taken_as_given(server: ServerProcess, offline: EmbeddingModel) -> None:
    ids = offline.tokenize("token ids in, vector out")
    resp = _client(server).embeddings.create(model=NAME, input=[ids, ids[1:-1]])
    expected = np.array(offline.embed([ids, ids[1:-1]]))
    np.testing.assert_allclose([d.embedding for d in resp.data], expected, atol=1e-6, rtol=0)
    assert resp.usage.prompt_tokens == 2 * len(ids) - 2


def test_models_lists_both_models(server: ServerProcess) -> None:
    ids = [m.id for m in _client(server).models.list().data]
    assert ids == ["test-model", NAME]


def test_truncation_is_opt_in_and_keeps_the_first_tokens(
    server: ServerProcess, offline: EmbeddingModel
) -> None:
    text = "many words " * 200
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model=NAME, input=text)
    assert info.value.code == "context_length_exceeded" and "256" in info.value.message
    resp = client.embeddings.create(
        model=NAME, input=text, extra_body={"truncate_prompt_tokens": 16}
    )
    ids = offline.tokenize(text)
    kept = ids[:15] + ids[-1:]  # [CLS] + 14 tokens + [SEP]
    assert resp.usage.prompt_tokens == 16
    np.testing.assert_allclose(resp.data[0].embedding, offline.embed([kept])[0], atol=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": ["fine", ""]}, 400, "input.1"),
        ({"input": [[101, 10**6]]}, 400, "input"),
        ({"input": 5}, 400, "input"),
        ({"input": "hi", "dimensions": 64}, 400, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "hi", "model": "no-such-model"}, 404, "model"),
        ({"input": ["x"] * 2049}, 400, "input"),
    ],
)
def test_bad_input_gets_an_openai_error(
    server: ServerProcess, body: dict[str, Any], status: int, param: str
) -> None:
    r = httpx.post(server.url + "/v1/embeddings", json={"model": NAME, **body}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]


def test_a_request_larger_than_the_queue_gets_429_and_the_server_goes_on(
    server: ServerProcess,
) -> None:
    r = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": NAME, "input": ["word"] * (QUEUE + 1)},
        timeout=30,
    )
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
    assert float(r.headers["retry-after"]) >= 1
    ok = _client(server).embeddings.create(model=NAME, input=["word"] * QUEUE)
    assert len(ok.data) == QUEUE


def test_concurrent_requests_share_batches_and_each_gets_its_own_vector(
    server: ServerProcess, offline: EmbeddingModel
) -> None:
    texts = [f"sentence number {i} is about {w}" for i, w in enumerate(["cats", "tax"] * 24)]
    batches_before = server.metric("surge:embedding_batch_size_count", model_name=NAME)

    async def send_all() -> list[list[float]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        async with client:
            resps = await asyncio.gather(
                *(client.embeddings.create(model=NAME, input=t) for t in texts)
            )
        return [r.data[0].embedding for r in resps]

    got = np.array(asyncio.run(send_all()))
    expected = np.array([offline.embed([offline.tokenize(t)])[0] for t in texts])
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    batches = server.metric("surge:embedding_batch_size_count", model_name=NAME) - batches_before
    assert 1 <= batches < len(texts)  # at least two requests shared a batch
    assert server.metric("surge:embedding_queue_depth", model_name=NAME) == 0


def test_generation_still_works_beside_embeddings(server: ServerProcess) -> None:
    out = _client(server).completions.create(
        model="test-model", prompt="Hi", max_tokens=4, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.completion_tokens == 4


def test_a_server_without_an_embedding_model_says_how_to_get_one(
    tiny_server: ServerProcess,
) -> None:
    r = httpx.post(tiny_server.url + "/v1/embeddings", json={"input": "hi"}, timeout=30)
    assert r.status_code == 404
    assert "--embedding-model" in r.json()["error"]["message"]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_score_and_rerank_are_the_cosine_of_the_vectors(
    server: ServerProcess, offline: EmbeddingModel
) -> None:
    query = "How do I feed a baby?"
    docs = ["The girl is carrying a baby.", "A man is eating food.", "Tax forms are due.",
            "A man is eating food."]  # fmt: skip
    vec = {t: np.array(offline.embed([offline.tokenize(t)])[0]) for t in [query, *docs]}
    expected = [_cosine(vec[query], vec[d]) for d in docs]
    r = httpx.post(server.url + "/v1/score", json={"model": NAME, "text_1": query,
                                                   "text_2": docs}, timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text
    got = r.json()
    assert [d["index"] for d in got["data"]] == [0, 1, 2, 3] and got["model"] == NAME
    np.testing.assert_allclose([d["score"] for d in got["data"]], expected, atol=1e-5)
    # Distinct texts are embedded once: the query and three documents.
    assert got["usage"]["prompt_tokens"] == sum(len(offline.tokenize(t)) for t in vec)
    pairwise = httpx.post(server.url + "/score", json={"text_1": docs[:2], "text_2": docs[1:3]},
                          timeout=30).json()  # fmt: skip
    np.testing.assert_allclose([d["score"] for d in pairwise["data"]],
                               [_cosine(vec[docs[0]], vec[docs[1]]),
                                _cosine(vec[docs[1]], vec[docs[2]])], atol=1e-5)  # fmt: skip
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        ranked = httpx.post(server.url + path, json={"model": NAME, "query": query,
                                                     "documents": docs, "top_n": 2},
                            timeout=30).json()  # fmt: skip
        best = sorted(range(len(docs)), key=lambda i: -expected[i])[:2]
        assert [x["index"] for x in ranked["results"]] == best
        assert ranked["results"][0]["document"]["text"] == docs[best[0]]
        np.testing.assert_allclose([x["relevance_score"] for x in ranked["results"]],
                                   [expected[i] for i in best], atol=1e-5)  # fmt: skip
    bad = httpx.post(server.url + "/v1/score", json={"text_1": docs[:2], "text_2": docs[:3]},
                     timeout=30)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text_1"
    empty = httpx.post(server.url + "/v1/rerank", json={"query": query, "documents": []},
                       timeout=30)  # fmt: skip
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "documents"


def test_embeddings_pass_through_the_gateway(server: ServerProcess) -> None:
    from tests.gateway.processes import GatewayProcess

    gateway = GatewayProcess("--upstream", server.url)
    try:
        gateway.wait_ready(num_upstreams=1)
        texts = ["through the gateway", "and back"]
        via = openai.OpenAI(base_url=gateway.url + "/v1", api_key="none", max_retries=0)
        got = via.embeddings.create(model=NAME, input=texts)
        direct = _client(server).embeddings.create(model=NAME, input=texts)
        np.testing.assert_array_equal(
            [d.embedding for d in got.data], [d.embedding for d in direct.data]
        )
        bad = httpx.post(gateway.url + "/v1/embeddings", json={"model": NAME, "input": ""})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
        for path in ("/rerank", "/v1/rerank"):
            ranked = httpx.post(gateway.url + path, json={"query": "a", "documents": ["a", "b"]},
                                timeout=30)  # fmt: skip
            assert [x["index"] for x in ranked.json()["results"]] == [0, 1]
    finally:
        gateway.stop()


def test_surge_bench_drives_embeddings_open_and_closed_loop(
    server: ServerProcess, tmp_path: Path
) -> None:
    import json

    from surge.bench import cli as bench_cli

    common = ["--url", server.url, "--model", NAME, "--api", "embeddings", "--input-len", "12",
              "--no-progress", "--slo", "ttft=30s"]  # fmt: skip
    closed, poisson = tmp_path / "closed.json", tmp_path / "poisson.json"
    assert bench_cli.main([*common, "--concurrency", "8", "--num-requests", "24",
                           "--output", str(closed)]) == 0  # fmt: skip
    assert bench_cli.main([*common, "--rate", "40", "--num-requests", "12",
                           "--output", str(poisson)]) == 0  # fmt: skip
    for path, n in ((closed, 24), (poisson, 12)):
        result = json.loads(path.read_text())
        summary = result["summary"]
        assert summary["num_ok"] == n and summary["num_errors"] == 0
        assert summary["num_output_tokens"] == 0 and summary["num_prompt_tokens"] > n
        assert summary["ttft"]["p50"] == pytest.approx(summary["e2e"]["p50"], abs=0.005)
        assert summary["goodput"]["fraction_met"] == 1.0
