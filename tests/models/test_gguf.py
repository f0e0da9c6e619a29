"""GGUF loading: the real SmolLM2 file against transformers, and tiny files written here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from surge.models.formats.model_files import open_model
from surge.models.formats.spec import ModelSpec, RopeScaling

Q = gguf.GGMLQuantizationType
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2
HEAD_DIM = HIDDEN // HEADS
# Byte-level vocabulary: 3 control tokens, the 256-symbol byte alphabet, 3 merges.
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
KV = KV_HEADS * HEAD_DIM
Shape = tuple[int, ...]
# (GGUF name, HF name, HF shape, storage type) per layer; q/k in F32 so un-permuting is exact.
LAYER_TENSORS: list[tuple[str, str, Shape, Q]] = [
    ("attn_norm.weight", "input_layernorm.weight", (HIDDEN,), Q.F32),
    ("attn_q.weight", "self_attn.q_proj.weight", (HIDDEN, HIDDEN), Q.F32),
    ("attn_k.weight", "self_attn.k_proj.weight", (KV, HIDDEN), Q.F32),
    ("attn_v.weight", "self_attn.v_proj.weight", (KV, HIDDEN), Q.F16),
    ("attn_q.bias", "self_attn.q_proj.bias", (HIDDEN,), Q.F32),
    ("attn_k.bias", "self_attn.k_proj.bias", (KV,), Q.F32),
    ("attn_v.bias", "self_attn.v_proj.bias", (KV,), Q.F32),
    ("attn_output.weight", "self_attn.o_proj.weight", (HIDDEN, HIDDEN), Q.F16),
    ("ffn_norm.weight", "post_attention_layernorm.weight", (HIDDEN,), Q.F32),
    ("ffn_gate.weight", "mlp.gate_proj.weight", (FFN, HIDDEN), Q.Q8_0),
    ("ffn_up.weight", "mlp.up_proj.weight", (FFN, HIDDEN), Q.Q4_0),
    ("ffn_down.weight", "mlp.down_proj.weight", (HIDDEN, FFN), Q.Q4_0),
]


GRANITE_SCALES = {"embedding_scale": 6.0, "attention.scale": 0.5, "residual_scale": 0.25,
                  "logit_scale": 4.0}  # fmt: skip


def byte_alphabet() -> list[str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (interleaved RoPE layout)."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_tiny_gguf(path: Path, arch: str = "llama", tied: bool = True) -> dict[str, np.ndarray]:
    """Write a 2-layer model; return the HF-layout float32 weights it encodes."""
    rng = np.random.default_rng(0)
    tokens = SPECIALS + byte_alphabet() + ["Ġt", "he", "Ġthe"]
    vocab = len(tokens)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name("tiny test model")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    if arch == "granite":  # its multipliers, as llama.cpp's converter names them
        for key, value in GRANITE_SCALES.items():
            writer.add_float32(f"granite.{key}", value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS)))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)

    hf: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, shape: Shape, qtype: Q, permute: int = 0) -> None:
        value = rng.standard_normal(shape).astype(np.float32)
        hf[hf_name] = value
        stored = llama_cpp_permute(value, permute) if permute else value
        if qtype == Q.F32:
            writer.add_tensor(gguf_name, stored)
        elif qtype == Q.F16:
            writer.add_tensor(gguf_name, stored.astype(np.float16))
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)

    add("token_embd.weight", "model.embed_tokens.weight", (vocab, HIDDEN), Q.Q8_0)
    add("output_norm.weight", "model.norm.weight", (HIDDEN,), Q.F32)
    if not tied:
        add("output.weight", "lm_head.weight", (vocab, HIDDEN), Q.F16)
    for i in range(LAYERS):
        for gguf_name, hf_name, shape, qtype in LAYER_TENSORS:
            if ".bias" in gguf_name and arch != "qwen2":
                continue
            # llama.cpp permutes q/k rows of Llama-style models only (Qwen2/3 use NeoX RoPE).
            heads = {"attn_q.weight": HEADS, "attn_k.weight": KV_HEADS}.get(gguf_name, 0)
            permute = heads if arch in ("llama", "smollm3", "granite") else 0
            add(f"blk.{i}.{gguf_name}", f"model.layers.{i}.{hf_name}", shape, qtype, permute)
        if arch == "qwen3":  # per-head q/k RMSNorm
            for x in ("q", "k"):
                hf_name = f"model.layers.{i}.self_attn.{x}_norm.weight"
                add(f"blk.{i}.attn_{x}_norm.weight", hf_name, (HEAD_DIM,), Q.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return hf


# Worst-case error of each storage type for standard-normal data (|x| < ~5 per block).
TOLERANCE = {"embed_tokens": 0.03, "lm_head": 0.005, "v_proj": 0.005, "o_proj": 0.005,
             "gate_proj": 0.03, "up_proj": 0.5, "down_proj": 0.5}  # fmt: skip


def tolerance(name: str) -> float:
    return next((tol for key, tol in TOLERANCE.items() if key in name), 0.0)


ARCHES = [("llama", True), ("llama", False), ("qwen2", True), ("qwen3", True),
          ("smollm3", True), ("granite", True)]  # fmt: skip


@pytest.mark.parametrize(("arch", "tied"), ARCHES)
def test_tiny_gguf_round_trip(tmp_path: Path, arch: str, tied: bool) -> None:
    path = tmp_path / "tiny.gguf"
    expected = write_tiny_gguf(path, arch, tied)
    model = open_model(path)
    spec = model.spec
    assert (spec.architecture, spec.num_layers, spec.hidden_size) == (arch, LAYERS, HIDDEN)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (HEADS, KV_HEADS, HEAD_DIM)
    assert (spec.intermediate_size, spec.vocab_size) == (FFN, 262)
    assert (spec.rope_theta, spec.rms_norm_eps, spec.max_position_embeddings) == (
        50000.0,
        1e-6,
        256,
    )
    assert spec.tie_word_embeddings is tied
    assert spec.attention_bias is (arch == "qwen2")
    assert spec.qk_norm is (arch == "qwen3")
    scales = (spec.embed_scale, spec.attn_scale, spec.residual_scale, spec.logit_scale)
    if arch == "granite":
        assert scales == tuple(GRANITE_SCALES.values())
    weights = dict(model.weights())
    assert set(weights) == set(expected)
    for name, value in expected.items():
        got = weights[name]
        assert got.dtype == torch.float32 and tuple(got.shape) == value.shape, name
        # q/k are stored as F32, so exact equality also proves the un-permutation.
        diff = (got - torch.from_numpy(value)).abs().max().item()
        assert diff <= tolerance(name), (name, diff)
    tok = model.tokenizer
    assert tok.encode("the<|im_end|> the") == [tok.backend.token_to_id(t) for t in
                                               ["t", "he", "<|im_end|>", "Ġthe"]]  # fmt: skip
    assert tok.decode(tok.encode("the 42 ünï"), skip_special_tokens=True) == "the 42 ünï"


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    path = tmp_path / "falcon.gguf"
    writer = gguf.GGUFWriter(path, "falcon")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="falcon"):
        ModelSpec.from_gguf(gguf.GGUFReader(path))


@pytest.mark.slow
def test_real_spec(smollm2_gguf_path: Path) -> None:
    spec = ModelSpec.from_gguf(gguf.GGUFReader(smollm2_gguf_path))
    assert spec == ModelSpec(
        architecture="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        rope_scaling=None,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attention_bias=False,
    )


@pytest.mark.slow
def test_real_weights_equal_transformers(smollm2_gguf_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF")
    path = smollm2_gguf_path
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).state_dict()
    ours = dict(open_model(path).weights())
    # transformers lists the tied head too; we leave it out (tie_word_embeddings).
    assert set(ours) == set(reference) - {"lm_head.weight"}
    assert torch.equal(reference["lm_head.weight"], ours["model.embed_tokens.weight"])
    for name, value in ours.items():
        assert value.dtype == torch.float32 and value.shape == reference[name].shape, name
        assert (value - reference[name]).abs().max().item() <= 1e-6, name


def spec_of(path: Path, rope_freqs: np.ndarray | None = None, **rope: Any) -> ModelSpec:
    """Spec of a tensor-less llama GGUF with the given rope scaling metadata."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_rope_freq_base(500000.0)
    writer.add_vocab_size(8)
    for key, value in rope.items():
        getattr(writer, f"add_rope_scaling_{key}")(value)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return ModelSpec.from_gguf(gguf.GGUFReader(path))


def test_gguf_rope_scaling(tmp_path: Path) -> None:
    linear = spec_of(tmp_path / "a.gguf", type=gguf.RopeScalingType.LINEAR, factor=2.0)
    assert linear.rope_scaling == RopeScaling("linear", 2.0)
    yarn = spec_of(
        tmp_path / "b.gguf", type=gguf.RopeScalingType.YARN, factor=4.0, orig_ctx_len=4096
    )
    assert yarn.rope_scaling == RopeScaling("yarn", 4.0, 4096)
    # Llama 3.1 files keep only per-frequency divisors, computed as llama.cpp's converter does.
    inv_freq = 1.0 / 500000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    wavelen = 2 * np.pi / inv_freq
    smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
    divisors = np.where(wavelen < 8192 / 4, 1.0, 1 / ((1 - smooth) / 8.0 + smooth))
    divisors = np.where(wavelen > 8192, 8.0, divisors)
    llama3 = spec_of(tmp_path / "c.gguf", rope_freqs=divisors)
    assert llama3.rope_scaling == RopeScaling("llama3", 8.0, 8192, 1.0, 4.0)
    with pytest.raises(ValueError, match="rope_freqs"):
        spec_of(tmp_path / "d.gguf", rope_freqs=divisors[::-1].copy())


def test_fast_reader_reads_what_gguf_py_reads(smollm2_gguf_path: Path) -> None:
    """GGUFFile (metadata parsed with struct) against gguf-py's GGUFReader on the real file:
    every field's contents, and every tensor's record and bytes."""
    import numpy as np

    from surge.models.formats.gguf_file import GGUFFile

    ours, ref = GGUFFile(smollm2_gguf_path), gguf.GGUFReader(smollm2_gguf_path)
    names = {k for k in ref.fields if not k.startswith("GGUF.")}
    assert set(ours.fields) == names
    for name in names:
        field = ours.get_field(name)
        assert field is not None and field.contents() == ref.get_field(name).contents(), name
    assert len(ours.tensors) == len(ref.tensors)
    for a, b in zip(ours.tensors, ref.tensors, strict=True):
        assert (a.name, a.tensor_type, a.n_bytes, a.data_offset) == (
            b.name, b.tensor_type, b.n_bytes, b.data_offset,
        )  # fmt: skip
        assert a.shape.tolist() == b.shape.tolist() and a.data.dtype == b.data.dtype
        assert np.array_equal(a.data, b.data)
