"""Prompt logprobs (vLLM's prompt_logprobs): each prompt token's log-probability given those
before it, from the serving path itself, the same as the model's own teacher-forced scores,
whatever the chunking, and computed even when the prompt is in the prefix cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.engine.llm import LLM
from surge.models.evaluate import token_logprobs
from surge.sampling_params import SamplingParams

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."


@pytest.mark.parametrize("chunk", [None, 7])
def test_prompt_logprobs_are_the_models_scores(tiny_model_dir: Path, chunk: int | None) -> None:
    kwargs = {} if chunk is None else {"max_num_batched_tokens": chunk}
    llm = LLM(str(tiny_model_dir), dtype="float32", kv_cache_memory_gib=0.05, block_size=4,
              **kwargs)  # type: ignore[arg-type]  # fmt: skip
    ids = llm.tokenizer.encode(TEXT)
    ref = token_logprobs(llm.engine.model, ids)  # [len(ids) - 1]
    full = torch.log_softmax(_logits(llm, ids), dim=-1)
    # Once cold, once with the whole prompt in the prefix cache (a plain request first).
    llm.generate([ids], SamplingParams(max_tokens=1), use_tqdm=False)
    for _ in range(2):
        params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=2, n=2)
        (out,) = llm.generate([ids], params, use_tqdm=False)
        scores = out.prompt_logprobs
        assert scores is not None and scores[0] is None and len(scores) == len(ids)
        got = torch.tensor([s.logprob for s in scores[1:] if s is not None])
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        for pos, s in enumerate(scores[1:]):
            assert s is not None and len(s.top) == 2
            row = full[pos]
            assert s.rank == int((row > row[ids[pos + 1]]).sum()) + 1
            assert [t for t, _ in s.top] == row.topk(2).indices.tolist()


def _logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """Positions 0..n-2's logits: one plain prefill over a private cache of 1-token blocks."""
    from surge.models.attention import AttnMetadata, PrefillChunk

    model = llm.engine.model
    spec = model.spec
    n = len(ids)
    caches = [
        (torch.zeros(spec.num_kv_heads, n, 1, spec.head_dim),
         torch.zeros(spec.num_kv_heads, n, 1, spec.head_dim))
        for _ in range(spec.num_layers)
    ]  # fmt: skip
    attn = AttnMetadata(
        slot_mapping=torch.arange(n), decode_block_tables=torch.zeros((0, 1), dtype=torch.long),
        decode_seq_lens=torch.zeros(0, dtype=torch.long), decode_bias=torch.zeros((0, 1, 1)),
        prefills=(PrefillChunk(0, n, 0, torch.arange(n)),), logits_indices=torch.arange(n - 1),
        kv_caches=caches,
    )  # fmt: skip
    with torch.inference_mode():
        return model(torch.tensor(ids), torch.arange(n), attn).float()
