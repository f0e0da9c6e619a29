"""HF model folders: config.json + *.safetensors (single or sharded) + tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from surge.models.formats.model_files import open_model
from surge.models.formats.spec import ModelSpec, RopeScaling

transformers = pytest.importorskip("transformers")

HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, VOCAB = 32, 64, 4, 2, 2, 300
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)


def hf_config(arch: str, tied: bool, **extra: Any) -> dict[str, Any]:
    name = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    return {
        "architectures": [name],
        "model_type": arch,
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 500000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": tied,
        **extra,
    }


def random_weights(arch: str, tied: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    kv = KV_HEADS * HIDDEN // HEADS
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    shapes["model.norm.weight"] = (HIDDEN,)
    if not tied:
        shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (HIDDEN,)
        shapes[p + "post_attention_layernorm.weight"] = (HIDDEN,)
        for proj, rows in (("q", HIDDEN), ("k", kv), ("v", kv)):
            shapes[p + f"self_attn.{proj}_proj.weight"] = (rows, HIDDEN)
            if arch == "qwen2":
                shapes[p + f"self_attn.{proj}_proj.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (HIDDEN, HIDDEN)
        shapes[p + "mlp.gate_proj.weight"] = (FFN, HIDDEN)
        shapes[p + "mlp.up_proj.weight"] = (FFN, HIDDEN)
        shapes[p + "mlp.down_proj.weight"] = (HIDDEN, FFN)
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def save_tokenizer(folder: Path) -> Any:
    """A small byte-level BPE tokenizer, saved the way transformers saves one."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])}
    for char in sorted(alphabet):
        vocab[char] = len(vocab)
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    backend = HFTokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True) for t in list(vocab)[:3]])
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    hf.chat_template = TEMPLATE
    hf.save_pretrained(folder)
    return hf


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("qwen2", True)])
def test_hf_folder(tmp_path: Path, arch: str, tied: bool) -> None:
    weights = random_weights(arch, tied)
    # Checkpoints are often bf16; we promise float32 out.
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, tmp_path / "model.safetensors")
    extra = {"sliding_window": 128, "use_sliding_window": False} if arch == "qwen2" else {}
    (tmp_path / "config.json").write_text(json.dumps(hf_config(arch, tied, **extra)))
    hf_tok = save_tokenizer(tmp_path)

    model = open_model(tmp_path)
    spec = model.spec
    assert spec == ModelSpec(
        architecture=arch,
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_layers=LAYERS,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HIDDEN // HEADS,
        rms_norm_eps=1e-6,
        rope_theta=500000.0,
        rope_scaling=None,
        max_position_embeddings=4096,
        tie_word_embeddings=tied,
        attention_bias=arch == "qwen2",
        sliding_window=None,
    )
    loaded = dict(model.weights())
    assert set(loaded) == set(weights)
    for name, value in loaded.items():
        assert value.dtype == torch.float32
        assert torch.equal(value, weights[name].to(torch.bfloat16).float()), name

    tok = model.tokenizer
    assert (tok.bos_token_id, tok.eos_token_ids) == (1, (2,))
    text = "the<|im_end|> the ünï"
    assert tok.encode(text) == hf_tok.encode(text)
    assert tok.decode(tok.encode(text)) == hf_tok.decode(hf_tok.encode(text), True)
    chat = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat) == hf_tok.apply_chat_template(chat, tokenize=False)


def test_sharded_folder(tmp_path: Path) -> None:
    weights = random_weights("llama", tied=True)
    names = sorted(weights)
    shards = {
        "model-00001-of-00002.safetensors": names[:7],
        "model-00002-of-00002.safetensors": names[7:],
    }
    weight_map = {}
    for file, shard_names in shards.items():
        save_file({n: weights[n] for n in shard_names}, tmp_path / file)
        weight_map.update(dict.fromkeys(shard_names, file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    config = hf_config("llama", tied=True, torch_dtype="float32")
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    save_tokenizer(tmp_path)

    model = open_model(tmp_path)
    loaded = dict(model.weights())
    assert loaded.keys() == weights.keys()
    assert all(torch.equal(loaded[n], weights[n]) for n in names)
    assert model.tokenizer.eos_token_ids == (2, 0)

    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="missing shard"):
        open_model(tmp_path)


def test_config_rope_scaling_and_errors() -> None:
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    spec = ModelSpec.from_hf_config(hf_config("llama", True, rope_scaling=llama3))
    assert spec.rope_scaling == RopeScaling("llama3", 8.0, 8192, 1.0, 4.0)
    # transformers >= 5 nests theta and scaling under rope_parameters.
    nested = hf_config("llama", True, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                                       "rope_theta": 1e6})  # fmt: skip
    del nested["rope_theta"]
    spec = ModelSpec.from_hf_config(nested)
    assert (spec.rope_theta, spec.rope_scaling) == (1e6, RopeScaling("yarn", 4.0))
    mistral = hf_config("llama", False, architectures=["MistralForCausalLM"], sliding_window=4096)
    assert ModelSpec.from_hf_config(mistral).sliding_window == 4096
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM"):
        ModelSpec.from_hf_config(hf_config("llama", True, architectures=["GPTNeoXForCausalLM"]))
    with pytest.raises(ValueError, match="longrope"):
        ModelSpec.from_hf_config(
            hf_config("llama", True, rope_scaling={"type": "longrope", "factor": 2})
        )
