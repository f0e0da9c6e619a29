"""The model's generation_config.json sets the sampling a request leaves out (vLLM's
--generation-config auto): top_k 1 makes an unspecified request greedy, max_new_tokens its
length; a request's own fields still win."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.servers import ServerProcess


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("genconfig") / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({"top_k": 1, "max_new_tokens": 7}))
    srv = ServerProcess(folder, "--dtype", "float32",
                        "--override-generation-config", '{"temperature": 1.5}')  # fmt: skip
    yield srv
    srv.stop()


def test_the_models_defaults_fill_what_a_request_leaves_out(server: ServerProcess) -> None:
    assert "defaults for the sampling fields" in server.log()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    chat = {"model": "test-model", "messages": [{"role": "user", "content": "Tell me a story."}],
            "extra_body": {"ignore_eos": True}}  # fmt: skip
    # top_k 1 (the model's), temperature 1.5 (the override): greedy whatever the seed
    outs = [client.chat.completions.create(seed=s, **chat) for s in (1, 2)]  # type: ignore[call-overload]
    greedy = client.chat.completions.create(temperature=0.0, max_tokens=7, **chat)  # type: ignore[call-overload]
    texts = {o.choices[0].message.content for o in outs}
    assert texts == {greedy.choices[0].message.content}
    assert all(o.usage.completion_tokens == 7 for o in outs)  # max_new_tokens
    assert outs[0].choices[0].finish_reason == "length"
    # The request's own top_k wins: sampling at 1.5 with two seeds parts ways.
    free = [client.chat.completions.create(seed=s, max_tokens=7, **{**chat, "extra_body": {
        "ignore_eos": True, "top_k": 0}}) for s in (1, 2)]  # type: ignore[call-overload]  # fmt: skip
    assert free[0].choices[0].message.content != free[1].choices[0].message.content
    # Completions keep OpenAI's max_tokens of 16 when none is given; the model's top_k holds.
    comp = client.completions.create(model="test-model", prompt="Once", seed=3,
                                     extra_body={"ignore_eos": True})  # fmt: skip
    same = client.completions.create(model="test-model", prompt="Once", temperature=0.0,
                                     extra_body={"ignore_eos": True})  # fmt: skip
    assert comp.usage is not None and comp.usage.completion_tokens == 16
    assert comp.choices[0].text == same.choices[0].text
