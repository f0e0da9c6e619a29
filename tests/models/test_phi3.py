"""Phi-3 / Phi-4-mini: fused qkv and gate_up weights, RoPE on part of each head, LongRoPE's
per-frequency factors, a sliding window on every layer. A tiny random Phi3ForCausalLM with all
of these must generate the same greedy tokens in Surge as in transformers (within the original
context, where both use the short factors), in one batch and through chunked prefill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from surge.models.formats.spec import ModelSpec
from surge.models.layers import RotaryEmbedding
from tests.models.tiny_hf import (
    assert_surge_greedy,
    hf_greedy,
    save_with_tokenizer,
    tokenizer_vocab,
)

ORIGINAL, WINDOW = 64, 24


@pytest.fixture(scope="module")
def tiny_phi3(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """4 layers, head_dim 16 with RoPE on the first 8, LongRoPE over an original 64 tokens."""
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(
        vocab_size=tokenizer_vocab(tiny_model_dir), hidden_size=64, intermediate_size=128,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=512, original_max_position_embeddings=ORIGINAL,
        partial_rotary_factor=0.5, sliding_window=WINDOW, tie_word_embeddings=False,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5, 3.0, 6.0],
                      "long_factor": [2.0, 4.0, 8.0, 16.0]},
        pad_token_id=None, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Phi3ForCausalLM(config).eval()
    with torch.no_grad():  # sharp attention, so that positions and the window decide tokens
        for name, p in model.named_parameters():
            if name.endswith("qkv_proj.weight"):
                p.normal_(0.0, 0.5)
    return save_with_tokenizer(model, tmp_path_factory.mktemp("tiny-phi3"), tiny_model_dir)


def test_tiny_phi3_matches_transformers(tiny_phi3: Path) -> None:
    from transformers import Phi3ForCausalLM

    spec = ModelSpec.from_hf_config(json.loads((tiny_phi3 / "config.json").read_text()))
    assert (spec.architecture, spec.rotary_dim, spec.window(0)) == ("phi3", 8, WINDOW)
    assert spec.rope_scaling is not None and spec.rope_scaling.kind == "longrope"
    assert spec.rope_scaling.factor == 512 / ORIGINAL
    max_tokens = 12  # 40 + 12 < 64: within the original context
    assert_surge_greedy(tiny_phi3, hf_greedy(Phi3ForCausalLM, tiny_phi3, max_tokens), max_tokens)


def test_longrope_rows_go_by_position(tiny_phi3: Path) -> None:
    """Short factors below the original length, long ones from it on, one row per position."""
    spec = ModelSpec.from_hf_config(json.loads((tiny_phi3 / "config.json").read_text()))
    assert spec.rope_scaling is not None
    rope = RotaryEmbedding(8, spec.rope_theta, spec.rope_scaling, 128)
    for factors, pos in ((spec.rope_scaling.short_factor, ORIGINAL - 1),
                         (spec.rope_scaling.long_factor, ORIGINAL)):  # fmt: skip
        inv = 1.0 / (torch.tensor(factors) * spec.rope_theta ** (torch.arange(0, 8, 2) / 8))
        angle = pos * inv
        torch.testing.assert_close(rope.cos[pos, :4] / rope.cos[0, 0], angle.cos())
    q = torch.randn(3, 4, 16)
    q_rope, _ = rope(torch.tensor([0, 5, 70]), q, q[:, :2])
    assert torch.equal(q_rope[..., 8:], q[..., 8:])  # the rest of each head passes through


def test_a_phi3_gguf_loads_fused_weights_and_its_rope(tmp_path: Path) -> None:
    """llama.cpp's Phi-3 layout: attn_qkv and ffn_up (gate and up) fused, NeoX RoPE unpermuted,
    rope.dimension_count for the partial rotary, LongRoPE's factors as two tensors."""
    import gguf
    import numpy as np

    from surge.models.formats.model_files import open_model
    from tests.models.test_gguf import MERGES, SPECIALS, byte_alphabet

    hidden, ffn, heads, kv_heads, head_dim, layers = 64, 128, 4, 2, 16, 2
    tokens = SPECIALS + byte_alphabet() + ["Ġt", "he", "Ġthe"]  # what MERGES make
    path = tmp_path / "phi3.gguf"
    w = gguf.GGUFWriter(path, "phi3")
    for add, value in ((w.add_block_count, layers), (w.add_context_length, 512),
                       (w.add_embedding_length, hidden), (w.add_feed_forward_length, ffn),
                       (w.add_head_count, heads), (w.add_head_count_kv, kv_heads),
                       (w.add_rope_dimension_count, 8), (w.add_sliding_window, WINDOW),
                       (w.add_rope_scaling_orig_ctx_len, ORIGINAL)):  # fmt: skip
        add(value)  # type: ignore[operator]
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_scaling_attn_factors(1.25)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    rng = np.random.default_rng(0)
    expected: dict[str, np.ndarray] = {}

    def add(name: str, hf: str | None, *shape: int) -> None:
        value = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, value)
        if hf is not None:
            expected[hf] = value

    add("token_embd.weight", "model.embed_tokens.weight", len(tokens), hidden)
    add("output_norm.weight", "model.norm.weight", hidden)
    add("output.weight", "lm_head.weight", len(tokens), hidden)
    w.add_tensor("rope_factors_short.weight", np.array([1.0, 1.5, 3.0, 6.0], np.float32))
    w.add_tensor("rope_factors_long.weight", np.array([2.0, 4.0, 8.0, 16.0], np.float32))
    qkv = (heads + 2 * kv_heads) * head_dim
    for i in range(layers):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", hidden)
        add(f"blk.{i}.attn_qkv.weight", p + "self_attn.qkv_proj.weight", qkv, hidden)
        add(f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", hidden, hidden)
        add(f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", hidden)
        add(f"blk.{i}.ffn_up.weight", p + "mlp.gate_up_proj.weight", 2 * ffn, hidden)
        add(f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = open_model(path)
    spec = model.spec
    assert (spec.architecture, spec.rotary_dim, spec.window(1)) == ("phi3", 8, WINDOW)
    scaling = spec.rope_scaling
    assert scaling is not None and scaling.kind == "longrope"
    assert (scaling.factor, scaling.attn_factor) == (512 / ORIGINAL, 1.25)
    assert (scaling.short_factor, scaling.long_factor) == ((1.0, 1.5, 3.0, 6.0),
                                                           (2.0, 4.0, 8.0, 16.0))  # fmt: skip
    weights = dict(model.weights())
    assert set(weights) == set(expected)
    for name, value in expected.items():
        assert torch.equal(weights[name], torch.from_numpy(value)), name
