"""Speculative decoding through HTTP: the real SmolLM2 served with prompt-lookup drafts answers a
copying request as the engine without drafts does, streamed (several tokens to a chunk when a
draft is accepted), and counts drafts in /metrics."""

from __future__ import annotations

import json

import openai
import pytest

from surge import LLM, SamplingParams
from tests.servers import ServerProcess

TEXT = (
    "Paged attention keeps the KV cache in fixed-size blocks so that memory is not wasted. "
    "Continuous batching lets new requests join the running batch at every step."
)
MESSAGES = [{"role": "user", "content": f"Repeat this text exactly:\n{TEXT}"}]


@pytest.mark.slow
def test_served_drafts_keep_the_answer() -> None:
    plain = LLM("smollm2-135m")
    prompt = plain.tokenizer.apply_chat_template(MESSAGES)
    params = SamplingParams(temperature=0.0, max_tokens=48)
    want = plain.generate(prompt, params, use_tqdm=False)[0].outputs[0].text
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 4})
    server = ServerProcess("smollm2-135m", "--speculative-config", spec)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        stream = client.chat.completions.create(
            model="test-model", messages=MESSAGES, max_tokens=48, temperature=0.0, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == want
        usage = chunks[-1].usage
        assert usage is not None
        content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
        assert len(content_chunks) < usage.completion_tokens  # accepted drafts: tokens per chunk
        accepted = server.metric("vllm:spec_decode_num_accepted_tokens_total")
        drafted = server.metric("vllm:spec_decode_num_draft_tokens_total")
        assert accepted <= drafted
        assert accepted >= usage.completion_tokens // 2  # most of the copy came from drafts
    finally:
        server.stop()


def test_a_bad_speculative_config_is_refused() -> None:
    import subprocess
    import sys

    bad = subprocess.run(
        [sys.executable, "-m", "surge.cli", "serve", "--speculative-config", '{"method": "eagle"}'],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode != 0 and "speculative method must be 'ngram'" in bad.stderr
