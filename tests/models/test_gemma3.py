"""Gemma 3 (the second architecture): a tiny random Gemma3ForCausalLM from transformers, saved as
an HF folder, must generate the same greedy tokens in Surge as in transformers, with prompts and
outputs longer than its sliding window, through chunked prefill and the prefix cache; and the
real Gemma 3 270M GGUF likewise (opt-in: pytest -m extra)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from surge.engine.llm import LLM
from surge.models.formats.spec import FULL, SLIDING, ModelSpec
from surge.sampling_params import SamplingParams
from tests.models.tiny_hf import (
    assert_surge_greedy,
    hf_greedy,
    save_with_tokenizer,
    tokenizer_vocab,
)

WINDOW = 8


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """Random weights (seeded), SmolLM2's tokenizer; 4 layers: sliding, sliding, full, sliding."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    vocab = tokenizer_vocab(tiny_model_dir)
    config = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
        sliding_window=WINDOW, layer_types=[SLIDING, SLIDING, FULL, SLIDING],
        max_position_embeddings=512, tie_word_embeddings=False,
        rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1_000_000.0},
                         SLIDING: {"rope_type": "default", "rope_theta": 10_000.0}},
    )  # fmt: skip
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():  # norms away from their zero init, so that the +1 matters
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.3)
    return save_with_tokenizer(model, tmp_path_factory.mktemp("tiny-gemma3"), tiny_model_dir)


def test_tiny_gemma3_matches_transformers(tiny_gemma3: Path) -> None:
    from transformers import Gemma3ForCausalLM

    spec = ModelSpec.from_hf_config(json.loads((tiny_gemma3 / "config.json").read_text()))
    assert spec.architecture == "gemma3" and spec.window(0) == WINDOW and spec.window(2) is None
    assert spec.attn_scale == pytest.approx(24**-0.5) and not spec.llama_block
    max_tokens = 14  # prompts and outputs past the window
    expected = hf_greedy(Gemma3ForCausalLM, tiny_gemma3, max_tokens)
    assert_surge_greedy(tiny_gemma3, expected, max_tokens)


@pytest.mark.slow
@pytest.mark.extra  # ~65 s and a 240 MB download: `pytest -m extra tests/models/test_gemma3.py`
def test_real_gemma3_270m_gguf_matches_transformers() -> None:
    """Google's Gemma 3 270M (Q4_K_M GGUF, fetched as the gemma3-270m alias): the same greedy
    tokens as transformers reading the same file."""
    from transformers import AutoModelForCausalLM

    from surge.models.formats.resolve import resolve_model

    path = resolve_model("gemma3-270m")
    llm = LLM(model=str(path), dtype="float32", quantization="none")
    prompt = llm.tokenizer.encode("The capital of France is")
    out = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0))
    ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                               dtype=torch.float32).eval()  # fmt: skip
    expected = ref.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)
    assert list(out[0].outputs[0].token_ids) == [int(t) for t in expected[0, len(prompt) :]]


def test_tiny_gemma3_with_a_lora_adapter_matches_peft(tiny_gemma3: Path, tmp_path: Path) -> None:
    """A PEFT LoRA adapter on every projection: Surge's greedy tokens with it are PEFT's."""
    from peft import PeftModel
    from transformers import Gemma3ForCausalLM

    from tests.lora_adapters import write_peft_adapter

    adapter = write_peft_adapter(tiny_gemma3, tmp_path / "adapter", r=4, alpha=8, scale=2.0)
    prompt = [(53 * i + 7) % 4000 + 200 for i in range(12)]
    base = Gemma3ForCausalLM.from_pretrained(tiny_gemma3, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, str(adapter)).eval()
    with torch.no_grad():
        ids = torch.tensor([prompt])
        expected = peft.generate(ids, max_new_tokens=10, do_sample=False, min_new_tokens=10)
    llm = LLM(model=str(tiny_gemma3), dtype="float32", kv_cache_memory_gib=0.05,
              lora_modules={"a": str(adapter)})  # type: ignore[arg-type]  # fmt: skip
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    (with_lora,) = llm.generate([prompt], params, lora_name="a", use_tqdm=False)
    (without,) = llm.generate([prompt], params, use_tqdm=False)
    assert list(with_lora.outputs[0].token_ids) == expected[0, len(prompt) :].tolist()
    assert list(without.outputs[0].token_ids) != list(with_lora.outputs[0].token_ids)
