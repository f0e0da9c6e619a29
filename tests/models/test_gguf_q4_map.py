"""GGUF Q4_0 and Q4_1 blocks map into Surge's q4 layout bit for bit (no float round trip), and a
Q4_0 file loads straight into those 4-bit layers: auto runs them, the weights are the file's."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from surge import LLM, SamplingParams
from surge.engine.runner.loader import q4_kernel_name
from surge.models.formats.model_files import open_model
from surge.models.forms import FORM_BY_TYPE, choose_form, q4_arrays
from surge.models.kernels import load_q4_linear
from surge.models.q4 import Q4Linear, _pack, dequantize_q4, pack_block_bytes
from surge.models.weights.gguf import unpermute_rope_rows
from surge.models.weights.gguf_blocks import q4_fields, q4_scales
from surge.models.weights.source import GGUFMatrix, StackedMatrix
from tests.models.test_shape_gguf import shapes

Q = gguf.GGMLQuantizationType
FORMATS = {Q.Q4_0: (18, 1), Q.Q4_1: (20, 2)}


def _random_blocks(kind: Q, rows: int, k: int) -> np.ndarray:
    """Every nibble value, float16 scales (and mins) of real weights' sizes and signs."""
    size, halves = FORMATS[kind]
    rng = np.random.default_rng(int(kind))
    raw = rng.integers(0, 256, (rows * k // 32, size), dtype=np.uint8)
    scales = (rng.standard_normal((len(raw), halves)) * 0.01).astype(np.float16)
    scales[:4] = [[0.0] * halves, [-0.0] * halves, [6e-8] * halves, [-3e-5] * halves]
    raw[:, : 2 * halves] = scales.view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", list(FORMATS), ids=lambda k: k.name)
@pytest.mark.parametrize("k", [576, 2048])  # a 512-group and a pair; groups only
def test_blocks_map_into_q4_exactly(kind: Q, k: int) -> None:
    raw = _random_blocks(kind, 24, k)
    q, d, m = q4_fields(torch.from_numpy(raw.copy()), kind)
    qs, dm = _pack(q), torch.stack([d, m], dim=1)
    got = dequantize_q4(qs, dm)
    want = gguf.quants.dequantize(raw, kind).astype(np.float32)
    # Equal floats are the same bits but for zero's sign: a zero-scale block's d * (q - 8) is
    # -0.0 for q < 8, d * q + m is +0.0 (the same value, to every kernel and matmul).
    assert np.array_equal(got.numpy(), want)
    nonzero = want != 0
    assert np.array_equal(got.numpy().view(np.uint32)[nonzero], want.view(np.uint32)[nonzero])
    if kind == Q.Q4_0:  # m = -8d, exactly, in float16
        assert torch.equal(m.float(), d.float() * -8.0)
    # The loader's byte-level repack (numpy, no unpacked values) is the same layout and scales.
    qb, d2, m2 = q4_scales(raw, kind)
    assert np.array_equal(pack_block_bytes(qb), qs.numpy())
    assert np.array_equal(d2.view(np.int16), d.numpy().view(np.int16))
    assert np.array_equal(m2.view(np.int16), m.numpy().view(np.int16))


def test_q4_forms_by_type_and_mode() -> None:
    assert FORM_BY_TYPE["Q4_0"] == FORM_BY_TYPE["Q4_1"] == "q4"
    assert choose_form(["Q4_0", "Q4_0", "Q4_0"], 2048, "gguf") == "q4"
    assert choose_form(["Q4_0", "Q4_1"], 2048, "gguf") == "q4"  # both map into the layout
    assert choose_form(["Q4_K", "Q4_K", "Q6_K"], 2048, "gguf") == "blocks"  # as segments
    assert choose_form(["Q4_0"], 96, "gguf") == "int8"  # not whole pairs of blocks
    # q4: layers 4-bit whatever they were; the head and embedding only from the file's blocks.
    assert choose_form(["Q8_0"], 2048, "q4") == "q4"
    assert choose_form(["Q8_0"], 2048, "q4", "head") == "int8"
    assert choose_form(["Q4_0"], 2048, "q4", "embedding") == "q4"
    assert choose_form(["Q4_0"], 2048, "none") == "float"
    assert choose_form(["Q4_0"], 2048, "w8a8") == "int8"


@pytest.fixture(scope="module")
def q4_0_file(tmp_path_factory: pytest.TempPathFactory, smollm2_gguf_path: str) -> str:
    """The tiny Llama shape (Llama 3's RoPE scaling, GQA, untied), every matrix Q4_0, written
    by benchmarks/make_shape_gguf.py's gguf.quants path."""
    path = tmp_path_factory.mktemp("q4_0") / "tiny.Q4_0.gguf"
    shapes.write_shape_gguf(
        shapes.SHAPES["tiny"], path, smollm2_gguf_path, progress=False, kind="Q4_0"
    )
    return str(path)


def test_a_q4_0_file_loads_its_blocks_as_they_are(q4_0_file: str) -> None:
    files = open_model(q4_0_file)
    assert files.layer_format == "Q4_0"
    reader = gguf.GGUFReader(q4_0_file)
    tensors = {t.name: t for t in reader.tensors}
    # q/k rows come back in HF order: the un-permutation is a gather of whole rows of blocks.
    spec = files.spec
    q_file = tensors["blk.0.attn_q.weight"]
    order = unpermute_rope_rows(np.arange(int(q_file.shape[1])), spec.num_heads)
    source = StackedMatrix([GGUFMatrix(q_file, order), GGUFMatrix(tensors["blk.0.attn_k.weight"])])
    qs, dm = q4_arrays(source)
    want = torch.from_numpy(gguf.quants.dequantize(q_file.data, Q.Q4_0).astype(np.float32))
    want = unpermute_rope_rows(want, spec.num_heads)
    assert torch.equal(dequantize_q4(qs, dm)[: want.shape[0]], want)

    llm = LLM(q4_0_file, device="cpu", dtype="float32", num_blocks=32)
    model = llm.engine.model
    down = model.layers[1].mlp.down_proj
    # auto: 4-bit layers where this CPU has the kernel (else int8)
    assert isinstance(down, Q4Linear) == (q4_kernel_name() is not None and _q4_builds())
    if isinstance(down, Q4Linear):
        ref = gguf.quants.dequantize(tensors["blk.1.ffn_down.weight"].data, Q.Q4_0)
        assert torch.equal(dequantize_q4(down.qs, down.dm), torch.from_numpy(ref))
        assert down.int8 is None  # no int8 copy unless q4-int8 asks for one
        # The untied head and the embedding are the file's Q4_0 blocks too.
        assert isinstance(model.lm_head, Q4Linear)
        assert isinstance(model.embed_tokens.head, Q4Linear)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    (out,) = llm.generate(["The capital of France is"], params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4


def test_q4_int8_keeps_the_copy(q4_0_file: str) -> None:
    llm = LLM(q4_0_file, device="cpu", dtype="float32", quantization="q4-int8", num_blocks=32)
    down = llm.engine.model.layers[0].mlp.down_proj
    assert isinstance(down, Q4Linear) and down.int8 is not None
    x = torch.randn(600, down.in_features)  # past every 4-bit row limit: the int8 copy
    assert torch.equal(down(x), down.int8(x))


def _q4_builds() -> bool:
    return load_q4_linear() is not None
