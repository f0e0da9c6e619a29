"""Qwen3 (dense): a tiny random Qwen3ForCausalLM from transformers, saved as an HF folder, must
generate the same greedy tokens in Surge as in transformers (per-head q/k RMSNorm before RoPE,
head_dim apart from hidden / heads), in one batch and through chunked prefill with a prefix-cache
hit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from surge.engine.llm import LLM
from surge.models.spec import ModelSpec
from surge.sampling_params import SamplingParams
from tests.models.tiny_hf import save_with_tokenizer, tokenizer_vocab


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """Random weights (seeded), SmolLM2's tokenizer; 3 layers, head_dim 24 (not 64 / 4)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab = tokenizer_vocab(tiny_model_dir)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, max_position_embeddings=512,
        tie_word_embeddings=True, rope_theta=1_000_000.0, use_sliding_window=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():  # q/k norms away from their ones init, so that they matter
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.normal_(1.0, 0.5)
    return save_with_tokenizer(model, tmp_path_factory.mktemp("tiny-qwen3"), tiny_model_dir)


def test_tiny_qwen3_matches_transformers(tiny_qwen3: Path) -> None:
    from transformers import Qwen3ForCausalLM

    spec = ModelSpec.from_hf_config(json.loads((tiny_qwen3 / "config.json").read_text()))
    assert (spec.architecture, spec.head_dim, spec.qk_norm) == ("qwen3", 24, True)
    assert not spec.attention_bias and spec.sliding_window is None and not spec.llama_block
    prompts = [[(37 * i + 11) % 5000 + 100 for i in range(n)] for n in (5, 21, 40)]
    max_tokens = 12
    ref = Qwen3ForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()
    expected = [
        ref.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                     min_new_tokens=max_tokens)[0, len(p) :].tolist()
        for p in prompts
    ]  # fmt: skip
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for kwargs in ({}, {"max_num_batched_tokens": 6, "block_size": 4}):
        llm = LLM(model=str(tiny_qwen3), dtype="float32", kv_cache_memory_gib=0.05, **kwargs)  # type: ignore[arg-type]
        outs = llm.generate([*prompts, prompts[2]], params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        assert got[:3] == expected, kwargs
        assert got[3] == expected[2]
