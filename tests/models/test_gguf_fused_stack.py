"""GGUF blocks in the fused decode stack (kernels/q4_decode.cpp with gguf_segments.h): a model
whose projections are the file's own blocks, K-quants, Q8_0 and Q4_0 mixed per layer and within
a fused q/k/v or gate/up (GGUFSegments), decodes through the stack to the layer-by-layer
path's hidden states and K/V; and the segmented GEMM (gguf_linear_parts) is GGUFLinear's own,
part by part, bit for bit."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from surge.models.attention import AttnMetadata
from surge.models.formats.spec import ModelSpec
from surge.models.forms import build_blocks, choose_form, estimate_forms
from surge.models.gguf_linear import GGML_TYPES, GGUFLinear, GGUFSegments
from surge.models.kernels import (
    GGUF_BLOCKS,
    load_gguf_blocks,
    load_paged_decode,
    load_q4_decode,
    load_q4_linear,
)
from surge.models.llama import LlamaForCausalLM
from surge.models.q4 import Q4Linear, quantize_q4
from surge.models.q4_decode import FusedQ4Decode
from surge.models.weights.source import GGUFMatrix, StackedMatrix
from tests.models.test_gguf_linear import random_blocks
from tests.models.test_q4_decode import (
    _fields,
    assert_caches_match,
    random_caches,
    row,
    step,
)

module = load_q4_decode()
needs_kernel = pytest.mark.skipif(load_gguf_blocks() is None, reason="no C++ toolchain here")
needs_stack = pytest.mark.skipif(
    module is None
    or not module.supported
    or load_paged_decode() is None
    or load_gguf_blocks() is None,
    reason="needs the C++ toolchain and AVX2 (the stack's lowest tier)",
)
# Float16 scales for random blocks whose weights' spread is ~0.03, as a real layer's is.
SCALE = {
    "Q4_0": 1.1e-3,
    "Q4_1": 5.7e-4,
    "Q8_0": 7.6e-5,
    "Q4_K": 2e-5,
    "Q5_K": 8.7e-6,
    "Q6_K": 4.5e-6,
}


def gguf_layer(kind: str, n: int, k: int, seed: int) -> GGUFLinear:
    qtype = GGML_TYPES[kind]
    raw = random_blocks(qtype, n, k, seed=seed, scale=SCALE[kind])
    return GGUFLinear(torch.from_numpy(raw), qtype, n, k)


def segments(kinds: list[str], rows: list[int], k: int, seed: int) -> GGUFSegments:
    parts = [
        gguf_layer(kind, n, k, seed + i)
        for i, (kind, n) in enumerate(zip(kinds, rows, strict=True))
    ]
    return GGUFSegments(parts)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 20])
def test_parts_are_each_part_on_its_own_blocks_bit_for_bit(rows: int) -> None:
    """Parts of multiples of 8 rows (whole tiles, as q/k/v and gate/up are): each output
    channel is the one GGUFLinear computes for its part alone, from the same rounding of x."""
    k = 512
    stack = segments(["Q4_K", "Q6_K", "Q8_0", "Q5_K"], [64, 24, 40, 16], k, seed=7)
    bias = torch.randn(stack.out_features)
    x = torch.randn(rows, k)
    want = torch.cat([p(x) for p in stack.segments()], dim=-1)
    assert torch.equal(stack(x), want)
    bf = x.bfloat16()
    got_bf = stack(bf)
    assert got_bf.dtype == torch.bfloat16
    assert torch.equal(got_bf, torch.cat([p(bf) for p in stack.segments()], dim=-1))
    stack.bias = bias
    assert torch.equal(stack(x), want + bias)


def test_segments_module_fallback_and_checks() -> None:
    """The torch path (dequantized parts, stacked): the same values as the kernel's, up to the
    int8 rounding of the activations the kernel does."""
    k = 256
    parts = [gguf_layer("Q4_K", 16, k, 1), gguf_layer("Q6_K", 8, k, 2)]
    stack = GGUFSegments(parts, torch.randn(24), kernels=False)
    assert stack.type_name == "Q4_K+Q6_K" and stack.out_features == 24
    w = torch.cat([p.dequantize() for p in parts])
    assert torch.equal(stack.dequantize(), w)
    x = torch.randn(2, 3, k)
    torch.testing.assert_close(stack(x), x @ w.t() + stack.bias, rtol=1e-4, atol=1e-4)
    if load_gguf_blocks() is not None:
        fast = GGUFSegments(parts, stack.bias)
        err = (fast(x) - stack(x)).norm() / stack(x).norm()
        assert err < 0.02  # int8 activations against float ones
    with pytest.raises(ValueError, match="one width"):
        GGUFSegments([parts[0], gguf_layer("Q4_K", 8, 512, 3)])
    with pytest.raises(ValueError, match="expected 24"):
        GGUFSegments(parts, torch.randn(5))


def spec_for(attention_bias: bool) -> ModelSpec:
    # Every width a multiple of 256 (the K-quants' super-block), head size 64.
    return ModelSpec(
        architecture="qwen2" if attention_bias else "llama",
        vocab_size=300,
        hidden_size=256,
        intermediate_size=512,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attention_bias=attention_bias,
    )


def q4_layer(n: int, k: int, seed: int) -> Q4Linear:
    torch.manual_seed(seed)
    qs, dm = quantize_q4(0.05 * torch.randn(n, k))
    return Q4Linear(qs, dm, None, load_q4_linear() is not None)


def gguf_model(spec: ModelSpec, dtype: torch.dtype) -> LlamaForCausalLM:
    """Layer 0 as a Q4_K_M file has it (q/k Q4_K with v Q6_K, down Q6_K); layer 1 other types
    and mixes: q/k/v in Q8_0, o in the 4-bit layout beside GGUF projections, gate/up Q5_K with
    Q4_0, down Q4_K."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(spec, spec.max_position_embeddings)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model = model.to(dtype)
    h, inter = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    plans: list[dict[str, nn.Module]] = [
        {
            "qkv_proj": segments(["Q4_K", "Q6_K"], [q + kv, kv], h, 10),
            "o_proj": gguf_layer("Q4_K", h, q, 20),
            "gate_up_proj": gguf_layer("Q4_K", 2 * inter, h, 30),
            "down_proj": gguf_layer("Q6_K", h, inter, 40),
        },
        {
            "qkv_proj": gguf_layer("Q8_0", q + 2 * kv, h, 50),
            "o_proj": q4_layer(h, q, 60),
            "gate_up_proj": segments(["Q5_K", "Q4_0"], [inter, inter], h, 70),
            "down_proj": gguf_layer("Q4_K", h, inter, 80),
        },
    ]
    for layer, plan in zip(model.layers, plans, strict=True):
        for name, new in plan.items():
            part = layer.self_attn if name in ("qkv_proj", "o_proj") else layer.mlp
            old = getattr(part, name)
            if name == "qkv_proj" and old.bias is not None:
                new.bias = old.bias.detach().float()
            setattr(part, name, new)
    return model.requires_grad_(False).eval()


LONG = [3 + 9 * i for i in range(12)]
MANY = [1 + 5 * i for i in range(20)]  # past 8 rows: per-row phases split between threads


@needs_stack
@pytest.mark.parametrize(
    ("dtype", "attention_bias", "lens"),
    [
        (torch.float32, False, [1]),
        (torch.float32, False, [40]),
        (torch.float32, True, [5, 16, 17]),
        (torch.float32, False, LONG),
        (torch.float32, True, MANY),
        (torch.bfloat16, False, [1, 31, 77]),
    ],
)
def test_stack_on_gguf_blocks_matches_layer_by_layer(
    dtype: torch.dtype, attention_bias: bool, lens: list[int]
) -> None:
    spec = spec_for(attention_bias)
    model = gguf_model(spec, dtype)
    base, ref_caches, fused_caches = random_caches(spec, dtype, seed=1)
    fused = FusedQ4Decode.build(model, fused_caches)
    assert fused is not None and fused.invariant is None  # no int8 copies beside GGUF blocks
    assert len(lens) <= fused.max_rows
    ids, positions, attn = step(spec, lens, ref_caches)
    fused_attn = AttnMetadata(**{**_fields(attn), "kv_caches": fused_caches})
    head = model.compute_logits
    with torch.inference_mode():
        logits = fused(ids, positions, fused_attn)
        # Hidden states after the final norm, before the head (as test_q4_decode compares).
        model.compute_logits = lambda x: x  # type: ignore[method-assign]
        want = torch.cat([model(*row(ids, positions, attn, i)) for i in range(len(lens))])
        got = fused(ids, positions, AttnMetadata(**{**_fields(attn), "kv_caches": base}))
        del model.compute_logits
    assert got.shape == want.shape == (len(lens), spec.hidden_size)
    # Both paths round each projection's input to int8 per block of 32 and run the same
    # kernels; float32 differs only by the order of sums outside them (norms, attention), which
    # now and then tips an activation's rounding by one step; bfloat16's layer-by-layer path
    # rounds every intermediate to 8 bits where the stack keeps float32.
    err = (got.float() - want.float()).abs() / want.float().abs().max()
    tol, typical = (5e-3, 1e-6) if dtype == torch.float32 else (5e-2, 5e-3)
    assert err.max() <= tol and err.median() <= typical
    assert torch.equal(logits, head(got).float())
    assert (logits.argmax(-1) == head(want).float().argmax(-1)).all()
    assert_caches_match(ref_caches, fused_caches, attn.slot_mapping, tol, typical)


@needs_stack
def test_stack_refuses_what_it_does_not_add() -> None:
    """A bias on a projection other than q/k/v (the stack adds only that one): layer by layer."""
    spec = spec_for(False)
    model = gguf_model(spec, torch.float32)
    _, _, caches = random_caches(spec, torch.float32, seed=1)
    assert FusedQ4Decode.build(model, caches) is not None
    down = model.layers[1].mlp.down_proj
    down.bias = torch.randn(down.out_features)
    assert FusedQ4Decode.build(model, caches) is None
    down.bias = None
    slow = model.layers[0].self_attn.o_proj
    slow.kernels = False  # the torch fallback: not the stack's rounding
    assert FusedQ4Decode.build(model, caches) is None


def test_block_sizes_are_the_kernels() -> None:
    assert {GGML_TYPES[k]: GGUF_BLOCKS[GGML_TYPES[k]] for k in SCALE} == GGUF_BLOCKS


def test_forms_keep_a_mixed_stack_on_its_blocks() -> None:
    assert choose_form(["Q4_K", "Q4_K", "Q6_K"], 2048, "gguf") == "blocks"
    assert choose_form(["Q5_K", "Q8_0"], 2048, "gguf") == "blocks"  # Q8_0 alone: int8
    assert choose_form(["Q4_0", "Q6_K"], 2048, "gguf") == "blocks"
    assert choose_form(["Q4_K", "F16"], 2048, "gguf") == "int8"  # no kernel for a part
    assert choose_form(["Q4_K", "Q6_K"], 2048, "gguf", "embedding") == "int8"


def test_a_mixed_stack_loads_as_segments_of_the_files_bytes(tmp_path: Path) -> None:
    """q/k in Q4_K and v in Q6_K, from a GGUF file: a GGUFSegments of two parts (q and k
    together), their blocks the file's bytes, and the estimate of its bytes exact."""
    raws = {
        "q": random_blocks(GGML_TYPES["Q4_K"], 64, 512, seed=1),
        "k": random_blocks(GGML_TYPES["Q4_K"], 32, 512, seed=2),
        "v": random_blocks(GGML_TYPES["Q6_K"], 32, 512, seed=3),
    }
    kinds = {"q": "Q4_K", "k": "Q4_K", "v": "Q6_K"}
    path = tmp_path / "mixed.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    for name, raw in raws.items():
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[kinds[name]])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    source = StackedMatrix([GGUFMatrix(tensors[n]) for n in ("q", "k", "v")])
    bias = torch.randn(128)
    layer = build_blocks(source, bias, kernels=True)
    assert isinstance(layer, GGUFSegments) and layer.type_name == "Q4_K+Q6_K"
    qk, v = layer.segments()
    assert np.array_equal(qk.blocks.numpy(), np.concatenate([raws["q"], raws["k"]]))
    assert np.array_equal(v.blocks.numpy(), raws["v"])
    assert torch.equal(layer.bias, bias)
    held = sum(p.blocks.numel() for p in layer.segments())
    assert held == sum(r.nbytes for r in raws.values())
    one = build_blocks(StackedMatrix([GGUFMatrix(tensors["q"])]), None, kernels=True)
    assert isinstance(one, GGUFLinear) and one.type_name == "Q4_K"


def test_the_estimate_counts_each_member_in_its_type() -> None:
    """Q4_K_M's pattern: q/k/gate/up/o Q4_K, v and down Q6_K; the estimate is the blocks' bytes."""
    spec = spec_for(False)
    kinds = {"model.embed_tokens.weight": "Q8_0", "lm_head.weight": "Q6_K"}
    members = {
        "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
        "mlp": ("gate_proj", "up_proj", "down_proj"),
    }
    for i in range(spec.num_layers):
        for part, names in members.items():
            for name in names:
                six = name in ("v_proj", "down_proj")
                kinds[f"model.layers.{i}.{part}.{name}.weight"] = "Q6_K" if six else "Q4_K"
    h, inter, kv = spec.hidden_size, spec.intermediate_size, spec.num_kv_heads * spec.head_dim
    q4k, q6k = 144 / 256, 210 / 256  # bytes a weight
    layer = (h * h + kv * h + h * h + 2 * inter * h) * q4k + (kv * h + h * inter) * q6k
    head = spec.vocab_size * h * q6k
    got = estimate_forms(spec, torch.float32, "gguf", kinds)
    assert got["blocks"] == spec.num_layers * layer + head
