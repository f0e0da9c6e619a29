"""SmolLM3: a Llama whose every n-th layer attends without RoPE. A tiny random
SmolLM3ForCausalLM from transformers must generate the same greedy tokens in Surge, in one batch
and through chunked prefill with a prefix-cache hit."""

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
    prompts = [[(37 * i + 11) % 5000 + 100 for i in range(n)] for n in (5, 21, 40)]
    max_tokens = 12
    ref = SmolLM3ForCausalLM.from_pretrained(tiny_smollm3, dtype=torch.float32).eval()
    expected = [
        ref.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                     min_new_tokens=max_tokens)[0, len(p) :].tolist()
        for p in prompts
    ]  # fmt: skip
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for kwargs in ({}, {"max_num_batched_tokens": 6, "block_size": 4}):
        llm = LLM(model=str(tiny_smollm3), dtype="float32", kv_cache_memory_gib=0.05, **kwargs)  # type: ignore[arg-type]
        outs = llm.generate([*prompts, prompts[2]], params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        assert got[:3] == expected, kwargs
        assert got[3] == expected[2]
