"""Scoring a prompt through HTTP with the official `openai` client: OpenAI's echo with logprobs
(how evaluation harnesses ask for log-likelihoods) and vLLM's prompt_logprobs, the same numbers
the engine computes offline."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams
from tests.servers import ServerProcess

TEXT = "Paris is the capital of France, and Berlin is the capital of Germany."


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_echo_with_logprobs_scores_the_prompt(
    tiny_server: ServerProcess, tiny_model_dir: Path
) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32", kv_cache_memory_gib=0.05)
    ids = llm.tokenizer.encode(TEXT)
    (offline,) = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=1),
                              use_tqdm=False)  # fmt: skip
    assert offline.prompt_logprobs is not None
    resp = _client(tiny_server).completions.create(
        model="test-model", prompt=TEXT, max_tokens=1, temperature=0.0, echo=True, logprobs=1
    )
    choice = resp.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert choice.text.startswith(TEXT)
    assert len(lp.tokens) == len(ids) + 1 and "".join(lp.tokens[: len(ids)]) == TEXT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = [s.logprob for s in offline.prompt_logprobs[1:] if s is not None]
    assert lp.token_logprobs[1 : len(ids)] == pytest.approx(expected, abs=1e-4)
    assert all(len(t or {}) >= 1 for t in lp.top_logprobs[1:])


def test_vllm_prompt_logprobs_in_completions_and_chat(tiny_server: ServerProcess) -> None:
    client = _client(tiny_server)
    resp = client.completions.create(model="test-model", prompt=TEXT, max_tokens=2,
                                     extra_body={"prompt_logprobs": 3})  # fmt: skip
    scores = resp.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
    assert scores[0] is None and len(scores) > 10
    for entry in scores[1:]:
        ranks = sorted(v["rank"] for v in entry.values())
        assert 3 <= len(entry) <= 4 and ranks[:3] == [1, 2, 3]
        assert all(
            v["logprob"] <= 0 and isinstance(v["decoded_token"], str) for v in entry.values()
        )
    chat = client.chat.completions.create(model="test-model", max_tokens=2,
                                          messages=[{"role": "user", "content": TEXT}],
                                          extra_body={"prompt_logprobs": 0})  # fmt: skip
    chat_scores = chat.model_extra["prompt_logprobs"]  # type: ignore[index]
    assert chat.usage is not None and len(chat_scores) == chat.usage.prompt_tokens
    plain = client.completions.create(model="test-model", prompt=TEXT, max_tokens=1)
    assert "prompt_logprobs" not in (plain.choices[0].model_extra or {})
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="test-model", prompt=TEXT, max_tokens=1, echo=True,
                                  logprobs=1, stream=True)  # fmt: skip
    assert err.value.body["param"] == "echo"  # type: ignore[index]


def test_a_long_prompts_logprobs_come_back_whole(tiny_server: ServerProcess) -> None:
    """The scores of a ~1,900-token prompt, 5 alternatives each, for 2 choices: an engine
    message of hundreds of KiB, written into the pipe in parts. The API process read it as one
    blocking read on a non-blocking fd, took the EAGAIN halfway for the engine's death, and
    exited (found by fuzzing)."""
    client = _client(tiny_server)
    prompt = " ".join(f"w{i}" for i in range(470))
    for _ in range(3):
        resp = client.completions.create(
            model="test-model", prompt=prompt, max_tokens=2, n=2, echo=True, logprobs=5
        )
        assert [len(c.logprobs.tokens or []) for c in resp.choices] == [  # type: ignore[union-attr]
            resp.usage.prompt_tokens + 2  # type: ignore[union-attr]
        ] * 2
    assert tiny_server.metric("vllm:num_requests_running") == 0  # and the server is still up
