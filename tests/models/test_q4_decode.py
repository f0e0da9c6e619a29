"""The fused decode stack (kernels/q4_decode.cpp) against the layer-by-layer model: the same
logits and the same K/V written to the cache, for 1 to 20 rows of different lengths across block
boundaries, on the 4-bit weights and on their int8 copies (larger steps); and in the engine, the
answers of the real SmolLM2."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from surge import LLM, SamplingParams
from surge.engine.client.outputs import EngineCoreRequest
from surge.models.attention import AttnMetadata, PrefillChunk
from surge.models.build import quantize_model
from surge.models.formats.spec import ModelSpec
from surge.models.kernels import load_paged_decode, load_q4_decode, load_w8a8_linear
from surge.models.kv_quant import dequantize_rows, quantize_rows
from surge.models.llama import LlamaForCausalLM
from surge.models.q4_decode import Q4_MAX_ROWS, FusedQ4Decode
from surge.models.quant import GEMV_MAX_ROWS

module = load_q4_decode()
needs_stack = pytest.mark.skipif(
    module is None or not module.supported or load_paged_decode() is None,
    reason="needs the C++ toolchain and AVX-512 VNNI or AVX2",
)
w8a8 = load_w8a8_linear()
# The layers' int8 copies are packed, and the stack takes steps past q4_max_rows on them, only
# where the packed GEMM has its VNNI tiles.
needs_int8_copies = pytest.mark.skipif(
    w8a8 is None or not w8a8.supported, reason="int8 copies packed only with AVX-512 VNNI"
)

BLOCK = 16


def small_spec(attention_bias: bool, num_heads: int = 4) -> ModelSpec:
    # Every width a multiple of 64 (the 4-bit layout), head size 64 (the stack's smallest).
    return ModelSpec(
        architecture="qwen2" if attention_bias else "llama",
        vocab_size=300,
        hidden_size=64 * num_heads,
        intermediate_size=640,
        num_layers=2,
        num_heads=num_heads,
        num_kv_heads=2,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        attention_bias=attention_bias,
    )


def q4_model(spec: ModelSpec, dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(spec, spec.max_position_embeddings)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model = model.to(dtype)
    # With the int8 copies (packed where AVX-512 VNNI is): the stack's int8 path is tested too.
    quantize_model(model, "q4-int8", dtype, use_kernels=True)
    return model.eval()


def step(
    spec: ModelSpec, lens: list[int], caches: list[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor, AttnMetadata]:
    """A decode step of one token per row at position len - 1, each row's blocks shuffled."""
    gen = torch.Generator().manual_seed(len(lens))
    num_blocks = caches[0][0].shape[1]
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots = [], []
    max_blocks = max(2, max((n + BLOCK - 1) // BLOCK for n in lens))
    for n in lens:
        need = (n + BLOCK - 1) // BLOCK
        table = [perm.pop() for _ in range(need)]
        pos = n - 1
        slots.append(table[pos // BLOCK] * BLOCK + pos % BLOCK)
        tables.append(table + [0] * (max_blocks - need))
    rows = len(lens)
    attn = AttnMetadata(
        slot_mapping=torch.tensor(slots),
        decode_block_tables=torch.tensor(tables),
        decode_seq_lens=torch.tensor(lens),
        decode_bias=torch.zeros((0, 1, 0)),
        prefills=(),
        logits_indices=torch.arange(rows),
        kv_caches=caches,
        decode_op=torch.ops.surge.paged_decode,
        write_kv_op=torch.ops.surge.write_kv,
    )
    ids = torch.randint(0, spec.vocab_size, (rows,), generator=gen)
    return ids, torch.tensor(lens) - 1, attn


LONG = [3 + 9 * i for i in range(12)]  # two row tiles: 8 rows, then 4
MANY = [1 + 5 * i for i in range(20)]
FOUR_BIT = 16  # a q4_max_rows that keeps every case below on the 4-bit weights


@needs_stack
@pytest.mark.parametrize(
    ("dtype", "attention_bias", "heads", "lens", "q4_max_rows"),
    [
        (torch.float32, False, 4, [1], FOUR_BIT),
        (torch.float32, False, 4, [40], FOUR_BIT),
        (torch.float32, True, 4, [5, 16, 17], FOUR_BIT),
        # Enough rows that attention goes a KV head's group at a time (2 queries, then 3).
        (torch.float32, False, 4, [1, 2, 15, 16, 17, 33, 64, 100], FOUR_BIT),
        (torch.float32, False, 6, [1, 2, 15, 16, 17, 33, 64, 100], FOUR_BIT),
        (torch.float32, False, 4, LONG, FOUR_BIT),
        (torch.bfloat16, False, 4, [1, 31, 77], FOUR_BIT),
        # 20 rows on the 4-bit weights: per-row phases (and their quantization) split by rows.
        (torch.float32, True, 6, MANY, 2 * FOUR_BIT),
        # The int8 copies through the packed GEMM, per-row phases split by rows.
        pytest.param(torch.float32, False, 4, LONG, GEMV_MAX_ROWS, marks=needs_int8_copies),
        pytest.param(torch.float32, True, 6, MANY, GEMV_MAX_ROWS, marks=needs_int8_copies),
        pytest.param(torch.bfloat16, True, 4, MANY, GEMV_MAX_ROWS, marks=needs_int8_copies),
    ],
)
def test_stack_matches_layer_by_layer(
    dtype: torch.dtype, attention_bias: bool, heads: int, lens: list[int], q4_max_rows: int
) -> None:
    spec = small_spec(attention_bias, heads)
    model = q4_model(spec, dtype)
    base, ref_caches, fused_caches = random_caches(spec, dtype, seed=1)
    fused = FusedQ4Decode.build(model, fused_caches, q4_max_rows)
    assert fused is not None and len(lens) <= fused.max_rows
    # On the int8 copies the reference is the model's own int8 path: all rows at once, past
    # GEMV_MAX_ROWS (the same weights and per-row activation scheme).
    int8 = len(lens) > q4_max_rows
    assert not int8 or len(lens) > GEMV_MAX_ROWS
    ids, positions, attn = step(spec, lens, ref_caches)
    fused_attn = AttnMetadata(**{**_fields(attn), "kv_caches": fused_caches})
    head = model.compute_logits
    with torch.inference_mode():
        logits = fused(ids, positions, fused_attn)
        # The final hidden states (after the norm), compared before the head: the head rounds
        # its input to int8 per row, which would amplify float32 reordering. On the 4-bit
        # weights the reference runs row by row (past GEMV_MAX_ROWS rows its layers would take
        # their int8 copy).
        model.compute_logits = lambda x: x  # type: ignore[method-assign]
        if int8:
            want = model(ids, positions, attn)
        else:
            want = torch.cat([model(*row(ids, positions, attn, i)) for i in range(len(lens))])
        got = fused(ids, positions, AttnMetadata(**{**_fields(attn), "kv_caches": base}))
        del model.compute_logits
    assert got.shape == want.shape == (len(lens), spec.hidden_size)
    # float32: the same sums in another order, so nearly every value agrees to rounding, and
    # the few where that reordering tipped an activation's int8 rounding by one step differ a
    # little more; bfloat16: the layer-by-layer path rounds every intermediate to 8 bits of
    # mantissa where the stack keeps float32.
    err = (got.float() - want.float()).abs() / want.float().abs().max()
    tol, typical = (5e-3, 1e-6) if dtype == torch.float32 else (5e-2, 5e-3)
    assert err.max() <= tol and err.median() <= typical
    assert torch.equal(logits, head(got).float())  # the caller's head on those states
    assert (logits.argmax(-1) == head(want).float().argmax(-1)).all()
    assert_caches_match(ref_caches, fused_caches, attn.slot_mapping, tol, typical)


@needs_stack
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prefill_chunk_as_rows_matches_the_layer_by_layer_prefill(dtype: torch.dtype) -> None:
    """A mixed step: 2 decodes, then a 20-token chunk of a prompt whose first 10 tokens are
    cached, each chunk token a row of its own (its request's table, its position + 1 as the
    length). The stack writes every row's K/V before any row attends, so that is causal
    attention; the reference is the model's own prefill path, in sub-chunks of at most
    GEMV_MAX_ROWS tokens (the rows that take the 4-bit kernel there too)."""
    spec = small_spec(True)
    model = q4_model(spec, dtype)
    _, ref_caches, fused_caches = random_caches(spec, dtype, seed=2)
    fused = FusedQ4Decode.build(model, fused_caches, 2 * FOUR_BIT)
    assert fused is not None
    dec_ids, dec_pos, dec = step(spec, [5, 40], ref_caches)
    start, n = 10, 20
    table = [100, 7, 64]  # blocks of the chunk's request, out of order
    chunk_pos = torch.arange(start, start + n)
    chunk_slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in chunk_pos.tolist()])
    chunk_ids = torch.randint(0, spec.vocab_size, (n,), generator=torch.Generator().manual_seed(3))
    ids, positions = torch.cat([dec_ids, chunk_ids]), torch.cat([dec_pos, chunk_pos])
    width = dec.decode_block_tables.shape[1]
    rows_tables = torch.tensor(table + [0] * (width - len(table))).expand(n, width)
    fused_attn = AttnMetadata(
        **_fields(dec)
        | {
            "slot_mapping": torch.cat([dec.slot_mapping, chunk_slots]),
            "decode_block_tables": torch.cat([dec.decode_block_tables, rows_tables]),
            "decode_seq_lens": torch.cat([dec.decode_seq_lens, chunk_pos + 1]),
            "logits_indices": torch.arange(2 + n),
            "kv_caches": fused_caches,
        }
    )
    with torch.inference_mode():
        model.compute_logits = lambda x: x  # type: ignore[method-assign]
        got = fused(ids, positions, fused_attn)
        want = [model(dec_ids, dec_pos, dec)]
        for s0 in range(0, n, GEMV_MAX_ROWS):
            s1 = min(n, s0 + GEMV_MAX_ROWS)
            piece = PrefillChunk(0, s1 - s0, start + s0, torch.tensor(table))
            attn = AttnMetadata(
                **_fields(dec)
                | {
                    "slot_mapping": chunk_slots[s0:s1],
                    "decode_block_tables": torch.zeros((0, 1), dtype=torch.long),
                    "decode_seq_lens": torch.zeros(0, dtype=torch.long),
                    "prefills": (piece,),
                    "logits_indices": torch.arange(s1 - s0),
                }
            )
            want.append(model(chunk_ids[s0:s1], chunk_pos[s0:s1], attn))
        del model.compute_logits
    expected = torch.cat(want)
    assert got.shape == expected.shape == (2 + n, spec.hidden_size)
    err = (got.float() - expected.float()).abs() / expected.float().abs().max()
    tol, typical = (5e-3, 1e-6) if dtype == torch.float32 else (5e-2, 5e-3)
    assert err.max() <= tol and err.median() <= typical
    assert_caches_match(ref_caches, fused_caches, fused_attn.slot_mapping, tol)


@needs_stack
@pytest.mark.parametrize("q4_max_rows", [1024, pytest.param(Q4_MAX_ROWS, marks=needs_int8_copies)])
def test_a_long_chunk_in_one_step_equals_it_in_pieces(q4_max_rows: int) -> None:
    """A 150-token chunk (over 10 blocks) as the rows of one step, and the same chunk in
    8-row pieces, each attending to the K/V the pieces before it wrote: the same outputs and
    cache, bit for bit, on the 4-bit weights and on the int8 copies (which took chunks of at
    most 64 tokens until they were measured faster at any length). A row that attended past
    its own position, or missed one before it, would differ."""
    spec = small_spec(True)
    model = q4_model(spec, torch.float32)
    _, whole_caches, piece_caches = random_caches(spec, torch.float32, seed=2)
    _, _, dec = step(spec, [5], whole_caches)
    start, n = 10, 150
    table = torch.tensor([100, 7, 64, 3, 90, 41, 12, 77, 5, 120, 33])
    pos = torch.arange(start, start + n)
    slots = table[pos // BLOCK] * BLOCK + pos % BLOCK
    ids = torch.randint(0, spec.vocab_size, (n,), generator=torch.Generator().manual_seed(3))

    def run(caches: Caches, rows: slice) -> torch.Tensor:
        fused = FusedQ4Decode.build(model, caches, q4_max_rows)
        assert fused is not None
        m = len(ids[rows])
        attn = AttnMetadata(
            **_fields(dec)
            | {
                "slot_mapping": slots[rows],
                "decode_block_tables": table.expand(m, len(table)).contiguous(),
                "decode_seq_lens": pos[rows] + 1,
                "logits_indices": torch.arange(m),
                "kv_caches": caches,
            }
        )
        return fused(ids[rows], pos[rows], attn)

    with torch.inference_mode():
        model.compute_logits = lambda x: x  # type: ignore[method-assign]
        whole = run(whole_caches, slice(0, n))
        pieces = torch.cat([run(piece_caches, slice(i, i + 8)) for i in range(0, n, 8)])
        del model.compute_logits
    assert torch.equal(whole, pieces)
    for (k1, v1), (k2, v2) in zip(whole_caches, piece_caches, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


@needs_stack
@pytest.mark.parametrize(
    ("q4_max_rows", "ref_rows"),
    [(1024, GEMV_MAX_ROWS), pytest.param(Q4_MAX_ROWS, 150, marks=needs_int8_copies)],
)
def test_a_long_chunk_differs_from_the_prefill_path_as_rounding_does(
    q4_max_rows: int, ref_rows: int
) -> None:
    """A 150-token chunk through the stack against the model's own prefill path (in pieces
    that take the same weights: 8 rows on the 4-bit ones, all 150 on the int8 copies). The two
    differ more than a short chunk does (max ~1e-3 of the largest value) because a float32
    reordering can tip one activation's int8 rounding, and a tipped K/V row reaches every later
    row. The prefill path itself moves as much when its input moves by float32 rounding
    (relative 1e-7, 3 draws): the stack must differ from it no more than 2x that. An error in
    attention would be orders of magnitude larger."""
    spec = small_spec(True)
    model = q4_model(spec, torch.float32)
    start, n = 10, 150
    table = torch.randperm(128, generator=torch.Generator().manual_seed(5))[:11]
    pos = torch.arange(start, start + n)
    slots = table[pos // BLOCK] * BLOCK + pos % BLOCK
    ids = torch.randint(0, spec.vocab_size, (n,), generator=torch.Generator().manual_seed(3))

    def prefill(noise: float, seed: int = 0) -> torch.Tensor:
        _, caches, _ = random_caches(spec, torch.float32, seed=2)
        _, _, dec = step(spec, [5], caches)
        gen = torch.Generator().manual_seed(seed)
        hook = model.embed_tokens.register_forward_hook(
            lambda m, i, out: out * (1 + noise * torch.randn(out.shape, generator=gen))
        )
        out = []
        for s0 in range(0, n, ref_rows):
            s1 = min(n, s0 + ref_rows)
            attn = AttnMetadata(
                **_fields(dec)
                | {
                    "slot_mapping": slots[s0:s1],
                    "decode_block_tables": torch.zeros((0, 1), dtype=torch.long),
                    "decode_seq_lens": torch.zeros(0, dtype=torch.long),
                    "prefills": (PrefillChunk(0, s1 - s0, start + s0, table),),
                    "logits_indices": torch.arange(s1 - s0),
                }
            )
            out.append(model(ids[s0:s1], pos[s0:s1], attn))
        hook.remove()
        return torch.cat(out)

    _, _, caches = random_caches(spec, torch.float32, seed=2)
    _, _, dec = step(spec, [5], caches)
    fused = FusedQ4Decode.build(model, caches, q4_max_rows)
    assert fused is not None
    attn = AttnMetadata(
        **_fields(dec)
        | {
            "slot_mapping": slots,
            "decode_block_tables": table.expand(n, len(table)).contiguous(),
            "decode_seq_lens": pos + 1,
            "logits_indices": torch.arange(n),
            "kv_caches": caches,
        }
    )
    with torch.inference_mode():
        model.compute_logits = lambda x: x  # type: ignore[method-assign]
        got, want = fused(ids, pos, attn), prefill(0.0)
        moved = [prefill(1e-7, seed) for seed in range(3)]
        del model.compute_logits
    scale = want.abs().max()
    err = (got - want).abs() / scale
    noise = [(m - want).abs() / scale for m in moved]
    noise_max, noise_mean = max(e.max() for e in noise), max(e.mean() for e in noise)
    assert noise_max > 1e-4  # the rounding tipped somewhere: the comparison means something
    assert err.max() <= 2 * noise_max and err.mean() <= 2 * noise_mean


@needs_stack
@pytest.mark.parametrize("lens", [[1], [5, 16, 17], [1, 2, 15, 16, 17, 33, 64, 100]])
def test_stack_with_an_int8_cache_matches_layer_by_layer(lens: list[int]) -> None:
    """An int8 cache: the stack writes each row's values and scale as the layer-by-layer path
    does (kv_quant.quantize_rows) and attends to them as the paged_decode op does."""
    spec = small_spec(False)
    model = q4_model(spec, torch.float32)
    _, ref_caches, fused_caches = random_caches(spec, torch.float32, seed=1)
    ref_caches = [(quantize_rows(k), quantize_rows(v)) for k, v in ref_caches]
    fused_caches = [(k.clone(), v.clone()) for k, v in ref_caches]
    fused = FusedQ4Decode.build(model, fused_caches, FOUR_BIT)
    assert fused is not None
    ids, positions, attn = step(spec, lens, ref_caches)
    with torch.inference_mode():
        model.compute_logits = lambda x: x  # type: ignore[method-assign]
        got = fused(ids, positions, AttnMetadata(**{**_fields(attn), "kv_caches": fused_caches}))
        want = torch.cat([model(*row(ids, positions, attn, i)) for i in range(len(lens))])
        del model.compute_logits
    err = (got - want).abs() / want.abs().max()
    assert err.max() <= 5e-3 and err.median() <= 1e-6
    written = attn.slot_mapping
    for (rk, rv), (fk, fv) in zip(ref_caches, fused_caches, strict=True):
        for ref, out in ((rk, fk), (rv, fv)):
            ref_rows, out_rows = ref.flatten(1, 2), out.flatten(1, 2)
            a = dequantize_rows(ref_rows[:, written], torch.float32)
            b = dequantize_rows(out_rows[:, written], torch.float32)
            step_size = a.abs().amax(-1, keepdim=True) / 127  # one int8 step of the row
            assert ((a - b).abs() <= step_size * 1.01 + 1e-6).all()
            same = ref_rows[:, written, :-4] == out_rows[:, written, :-4]
            assert same.float().mean() > 0.99  # the same int8 values, but for a rounding tie
            others = torch.ones(ref_rows.shape[1], dtype=torch.bool)
            others[written] = False
            assert torch.equal(out_rows[:, others], ref_rows[:, others])


Caches = list[tuple[torch.Tensor, torch.Tensor]]


def random_caches(spec: ModelSpec, dtype: torch.dtype, seed: int) -> tuple[Caches, Caches, Caches]:
    """The earlier tokens' K/V of two layers, random: the original and two copies of it (for
    the reference and the stack)."""
    shape = (spec.num_kv_heads, 128, BLOCK, spec.head_dim)
    torch.manual_seed(seed)
    base = [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for _ in range(2)]
    return (
        base,
        [(k.clone(), v.clone()) for k, v in base],
        [(k.clone(), v.clone()) for k, v in base],
    )


def assert_caches_match(
    ref_caches: Caches,
    fused_caches: Caches,
    written: torch.Tensor,
    tol: float,
    typical: float | None = None,
) -> None:
    """The slots `written` agree within `tol` (and their median error within `typical`, if
    given); nothing else was touched."""
    for (rk, rv), (fk, fv) in zip(ref_caches, fused_caches, strict=True):
        for ref, out in ((rk, fk), (rv, fv)):
            ref_f, out_f = ref.float().flatten(1, 2), out.float().flatten(1, 2)
            assert torch.allclose(out_f[:, written], ref_f[:, written], rtol=tol, atol=tol)
            if typical is not None:
                assert (out_f[:, written] - ref_f[:, written]).abs().median() <= typical
            others = torch.ones(ref_f.shape[1], dtype=torch.bool)
            others[written] = False
            assert torch.equal(out_f[:, others], ref_f[:, others])


def row(
    ids: torch.Tensor, positions: torch.Tensor, attn: AttnMetadata, i: int
) -> tuple[torch.Tensor, torch.Tensor, AttnMetadata]:
    """Row i of a decode step as a step of its own."""
    one = slice(i, i + 1)
    fields = _fields(attn) | {
        "slot_mapping": attn.slot_mapping[one],
        "decode_block_tables": attn.decode_block_tables[one],
        "decode_seq_lens": attn.decode_seq_lens[one],
        "logits_indices": torch.zeros(1, dtype=torch.long),
    }
    return ids[one], positions[one], AttnMetadata(**fields)  # type: ignore[arg-type]


def _fields(attn: AttnMetadata) -> dict[str, object]:
    return {name: getattr(attn, name) for name in AttnMetadata.__slots__}


@needs_stack
def test_refuses_what_it_cannot_run() -> None:
    """Head sizes other than 64/128 and non-4-bit layers fall back to the layer-by-layer path."""
    spec = small_spec(False)
    model = q4_model(spec, torch.float32)
    odd = dataclasses.replace(spec, num_heads=8, num_kv_heads=4, head_dim=32)
    caches = [(torch.zeros(4, 4, BLOCK, 32), torch.zeros(4, 4, BLOCK, 32)) for _ in range(2)]
    assert FusedQ4Decode.build(q4_model(odd, torch.float32), caches) is None
    plain = LlamaForCausalLM(spec, spec.max_position_embeddings)
    good = [(torch.zeros(2, 4, BLOCK, 64), torch.zeros(2, 4, BLOCK, 64)) for _ in range(2)]
    assert FusedQ4Decode.build(plain, good) is None
    assert FusedQ4Decode.build(model, good) is not None


@needs_stack
def test_engine_answers_through_the_stack() -> None:
    """Real SmolLM2, 4-bit, default dtype: decode steps take the stack, on the 4-bit weights up
    to Q4_MAX_ROWS requests and on the int8 copies past that (without AVX-512 VNNI: all on the
    4-bit weights), and the answers are the model's.
    (Token-for-token equality with the layer-by-layer path is not expected on a 30-layer model:
    rounding activations to int8 amplifies float32 reordering; a 1e-7 change of one norm
    weight moves that path's logits by as much as the stack differs from it.)"""
    llm = LLM("smollm2-135m", quantization="q4")
    runner = llm.engine.runner
    assert runner.fused is not None
    rows: list[int] = []
    stack = runner.fused.stack

    class Counting:  # records each call's row count, then runs the real stack
        def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
            rows.append(x.shape[0])
            return stack.forward(x, *rest)

    runner.fused.stack = Counting()
    params = SamplingParams(temperature=0.0, max_tokens=6)
    prompt = "The capital of France is"
    n = len(llm.tokenizer.encode(prompt))
    out = llm.generate([prompt], params, use_tqdm=False)
    assert "Paris" in out[0].outputs[0].text
    assert rows[0] == n and set(rows[1:]) == {1}  # the prompt's tokens as rows, then decodes
    rows.clear()
    many = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    texts = [prompt] * (Q4_MAX_ROWS + 4)
    outs = llm.generate(texts, many, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)
    assert rows[0] == n * len(texts) and Q4_MAX_ROWS + 4 in rows  # all of them in one step
    assert all("Paris" in o.outputs[0].text for o in outs)
    # A prompt that arrives while another request decodes joins its step.
    rows.clear()
    eng = llm.engine
    eng.add_request(EngineCoreRequest("a", llm.tokenizer.encode("Once upon a time"), many))
    eng.step()
    eng.step()
    eng.add_request(EngineCoreRequest("b", llm.tokenizer.encode(prompt), params))
    done: dict[str, list[int]] = {"a": [], "b": []}
    while eng.has_work():
        for o in eng.step():
            done[o.req_id] += o.new_token_ids
    assert rows[2] == 1 + n  # a's decode and b's prompt
    assert "Paris" in llm.tokenizer.decode(done["b"])
