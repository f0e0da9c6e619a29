"""Granite: a Llama with four multipliers (embeddings, attention scores, each block's residual
branch, logits). A tiny random GraniteForCausalLM from transformers, with multipliers far from
1, must generate the same greedy tokens in Surge and give the same logprobs (the logit divisor
shows there, not in argmax)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from surge.engine.llm import LLM
from surge.models.formats.spec import ModelSpec
from surge.sampling_params import SamplingParams
from tests.models.tiny_hf import save_with_tokenizer, tokenizer_vocab


@pytest.fixture(scope="module")
def tiny_granite(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    from transformers import GraniteConfig, GraniteForCausalLM

    config = GraniteConfig(
        vocab_size=tokenizer_vocab(tiny_model_dir), hidden_size=64, intermediate_size=128,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, tie_word_embeddings=True, embedding_multiplier=6.0,
        attention_multiplier=0.5, residual_multiplier=0.3, logits_scaling=4.0,
        pad_token_id=None, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GraniteForCausalLM(config).eval()
    return save_with_tokenizer(model, tmp_path_factory.mktemp("tiny-granite"), tiny_model_dir)


def test_tiny_granite_matches_transformers(tiny_granite: Path) -> None:
    from transformers import GraniteForCausalLM

    spec = ModelSpec.from_hf_config(json.loads((tiny_granite / "config.json").read_text()))
    assert spec.architecture == "granite" and not spec.llama_block
    assert (spec.embed_scale, spec.attn_scale, spec.residual_scale, spec.logit_scale) == (
        6.0, 0.5, 0.3, 4.0)  # fmt: skip
    prompts = [[(37 * i + 11) % 5000 + 100 for i in range(n)] for n in (5, 21, 40)]
    max_tokens = 10
    ref = GraniteForCausalLM.from_pretrained(tiny_granite, dtype=torch.float32).eval()
    expected, first_logprobs = [], []
    for p in prompts:
        out = ref.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                           min_new_tokens=max_tokens, output_scores=True,
                           return_dict_in_generate=True)  # fmt: skip
        tokens = out.sequences[0, len(p) :].tolist()
        expected.append(tokens)
        first_logprobs.append(torch.log_softmax(out.scores[0][0].float(), -1)[tokens[0]].item())
    llm = LLM(model=str(tiny_granite), dtype="float32", kv_cache_memory_gib=0.05)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
    for out, want in zip(outs, first_logprobs, strict=True):
        logprobs = out.outputs[0].logprobs
        assert logprobs is not None and math.isclose(logprobs[0].logprob, want, abs_tol=1e-4)
