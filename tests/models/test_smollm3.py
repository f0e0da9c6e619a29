"""SmolLM3: a Llama whose every n-th layer attends without RoPE. A tiny random
SmolLM3ForCausalLM from transformers must generate the same greedy tokens in Surge, in one batch
and through chunked prefill with a prefix-cache hit."""

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
def tiny_smollm3(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """Random weights (seeded), SmolLM2's tokenizer; 4 layers, the 2nd and 4th without RoPE."""
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    config = SmolLM3Config(
        vocab_size=tokenizer_vocab(tiny_model_dir), hidden_size=64, intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, no_rope_layer_interval=2, tie_word_embeddings=True,
        pad_token_id=None, bos_token_id=1, eos_token_id=2,  # its defaults are Llama 3's ids
    )  # fmt: skip
    torch.manual_seed(0)
    model = SmolLM3ForCausalLM(config).eval()
    with torch.no_grad():  # sharp attention, so that positions (RoPE or none) decide tokens
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.normal_(0.0, 0.5)
    return save_with_tokenizer(model, tmp_path_factory.mktemp("tiny-smollm3"), tiny_model_dir)


def test_tiny_smollm3_matches_transformers(tiny_smollm3: Path) -> None:
    from transformers import SmolLM3ForCausalLM

    spec = ModelSpec.from_hf_config(json.loads((tiny_smollm3 / "config.json").read_text()))
    assert (spec.architecture, spec.no_rope_layers) == ("smollm3", (1, 3))
    assert not spec.llama_block  # the fused CPU stack ropes every layer
    max_tokens = 12
    assert_surge_greedy(
        tiny_smollm3, hf_greedy(SmolLM3ForCausalLM, tiny_smollm3, max_tokens), max_tokens
    )
