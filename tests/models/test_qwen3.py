"""Qwen3 (dense): a tiny random Qwen3ForCausalLM from transformers, saved as an HF folder, must
generate the same greedy tokens in Surge as in transformers (per-head q/k RMSNorm before RoPE,
head_dim apart from hidden / heads), in one batch and through chunked prefill with a prefix-cache
hit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from surge.models.formats.spec import ModelSpec
from tests.models.tiny_hf import (
    assert_surge_greedy,
    hf_greedy,
    save_with_tokenizer,
    tokenizer_vocab,
)


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
    max_tokens = 12
    assert_surge_greedy(tiny_qwen3, hf_greedy(Qwen3ForCausalLM, tiny_qwen3, max_tokens), max_tokens)
