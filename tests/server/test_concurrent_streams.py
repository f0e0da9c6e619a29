"""64 concurrent streaming clients each get exactly the offline greedy text (SmolLM2, fp32)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams
from tests.servers import ServerProcess

pytestmark = pytest.mark.slow

NUM_CLIENTS = 64
MAX_TOKENS = 32
TOPICS = ["the sea", "a city", "machines", "music", "winter", "a garden", "the moon", "trains"]


def prompts() -> list[str]:
    return [f"Write sentence {i} about {TOPICS[i % len(TOPICS)]}:" for i in range(NUM_CLIENTS)]


@pytest.fixture(scope="module")
def smollm2_server(smollm2_gguf_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(smollm2_gguf_path, "--dtype", "float32", "--quantization", "none")
    yield server
    server.stop()


def test_64_streams_match_offline_greedy(
    smollm2_server: ServerProcess, smollm2_gguf_path: Path
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    offline = LLM(str(smollm2_gguf_path), dtype="float32", quantization="none").generate(
        prompts(), params, False
    )
    expected = [o.outputs[0].text for o in offline]

    async def one(client: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await client.completions.create(
            model="test-model", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
            stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_clients() -> list[str]:
        client = openai.AsyncOpenAI(
            base_url=smollm2_server.url + "/v1", api_key="x", max_retries=0, timeout=300
        )
        async with client:
            return await asyncio.gather(*[one(client, p) for p in prompts()])

    got = asyncio.run(all_clients())
    mismatches = [i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
    assert not mismatches, f"clients {mismatches} differ from offline greedy"
