"""Sampler behaviour on small hand-made logits: exact values and seeded statistics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from surge.engine.sample.sampler import (
    Sampler,
    SamplingRow,
    apply_min_tokens,
    apply_penalties,
    mix_seed,
    row_argmax,
)
from surge.sampling_params import SamplingParams

EOS = 7


def row(
    seed: int = 0,
    prompt: Sequence[int] = (),
    output: Sequence[int] = (),
    **params: Any,
) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), seed, tuple(prompt), tuple(output))


def random_logits(num_rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, vocab, generator=gen) * 2.0


SAMPLER = Sampler(eos_token_ids=[EOS])


def test_mix_seed_in_generator_range_and_varies() -> None:
    seeds = {mix_seed(s, t) for s in (-5, 0, 1, 2**63 + 3) for t in range(50)}
    assert len(seeds) == 200
    assert all(0 <= s < 2**63 for s in seeds)
    assert len({s & 0xFFFFFFFF for s in seeds}) == 200  # the CPU generator keeps 32 bits


def test_shape_mismatch_rejected() -> None:
    with pytest.raises(ValueError, match="logits"):
        SAMPLER(torch.zeros(2, 8), [row()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax(dtype: torch.dtype) -> None:
    logits = random_logits(5, 16).to(dtype)
    out = SAMPLER(logits, [row(temperature=0.0) for _ in range(5)])
    assert out.token_ids == logits.float().argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 5 and out.top_logprobs == [None] * 5
    # top_k=1 is greedy at any temperature; mixed with a logprobs row (the non-fast path).
    rows = [row(temperature=0.9, top_k=1), row(temperature=0.0, logprobs=2)] * 2 + [row(top_k=1)]
    assert SAMPLER(logits, rows).token_ids == logits.float().argmax(dim=-1).tolist()


def test_input_logits_not_modified() -> None:
    logits = random_logits(2, 8)
    before = logits.clone()
    rows = [
        row(output=[1, 2], repetition_penalty=1.5, frequency_penalty=1.0, min_tokens=5),
        row(seed=3, top_k=3, top_p=0.5, min_p=0.1),
    ]
    SAMPLER(logits, rows)
    assert torch.equal(logits, before)


def test_seeded_sample_independent_of_batch() -> None:
    vocab = 32
    logits = random_logits(1, vocab, seed=1)[0] * 0.3  # fairly flat: samples vary
    target = row(seed=1234, output=[1, 2, 3], temperature=1.0)
    alone = SAMPLER(logits.unsqueeze(0), [target]).token_ids[0]
    others = random_logits(4, vocab, seed=2)
    for position in range(5):
        batch = torch.cat([others[:position], logits.unsqueeze(0), others[position:]])
        rows = [row(seed=k, top_k=4) for k in range(position)]
        rows += [target]
        rows += [row(temperature=0.0, logprobs=1) for _ in range(4 - position)]
        assert SAMPLER(batch, rows).token_ids[position] == alone
    # Same (seed, step) with different earlier tokens: the draw depends only on the step count.
    same_step = row(seed=1234, output=[9, 9, 9], temperature=1.0)
    assert SAMPLER(logits.unsqueeze(0), [same_step]).token_ids[0] == alone


def test_seeded_sample_changes_with_step_and_seed() -> None:
    vocab = 1000
    logits = torch.zeros(1, vocab)  # uniform
    by_step = [SAMPLER(logits, [row(seed=5, output=[0] * t)]).token_ids[0] for t in range(40)]
    assert len(set(by_step)) >= 35
    by_seed = [SAMPLER(logits, [row(seed=s)]).token_ids[0] for s in range(40)]
    assert len(set(by_seed)) >= 35


def assert_follows(counts: Counter[int], probs: torch.Tensor, draws: int) -> None:
    """Chi-square goodness of fit; 40 is far beyond the 0.1% critical value (~24) for 7 dof."""
    expected = probs * draws
    observed = torch.tensor([counts.get(i, 0) for i in range(len(probs))], dtype=torch.float32)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 40.0, (chi2, observed.tolist(), expected.tolist())


def sample_many(logits_row: torch.Tensor, draws: int, **params: Any) -> Counter[int]:
    logits = logits_row.unsqueeze(0).expand(draws, -1)
    rows = [row(seed=10_000 + k, **params) for k in range(draws)]
    return Counter(SAMPLER(logits, rows).token_ids)


def test_temperature_sampling_follows_softmax() -> None:
    logits_row = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, 0.2, -1.0, 1.5])
    draws = 4000
    for temperature in (1.0, 0.6):
        counts = sample_many(logits_row, draws, temperature=temperature)
        assert_follows(counts, torch.softmax(logits_row / temperature, dim=-1), draws)


def test_top_k_stays_in_top_k_and_renormalises() -> None:
    logits_row = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, 0.2, -1.0, 1.5])
    counts = sample_many(logits_row, 3000, top_k=3)
    assert set(counts) <= {0, 4, 7}
    kept = (0, 4, 7)
    relabelled = Counter({j: counts[i] for j, i in enumerate(kept)})
    assert_follows(relabelled, torch.softmax(logits_row[list(kept)], dim=-1), 3000)


def test_top_p_stays_in_nucleus() -> None:
    # probs 0.5, 0.25, 0.125, ...: top_p=0.7 needs the first two, 0.8 the first three.
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03125, 0.03125])
    logits_row = probs.log()[[3, 0, 5, 1, 2, 4]]  # shuffled ids: nucleus is ids {1, 3}
    for top_p, nucleus in ((0.7, {1, 3}), (0.8, {1, 3, 4}), (0.4, {1})):
        counts = sample_many(logits_row, 600, top_p=top_p)
        assert set(counts) == nucleus, (top_p, counts)


def test_tiny_top_p_is_greedy() -> None:
    logits = random_logits(6, 50, seed=3)
    rows = [row(seed=s, top_p=1e-6, temperature=1.5) for s in range(6)]
    assert SAMPLER(logits, rows).token_ids == logits.argmax(dim=-1).tolist()


def test_top_k_then_top_p_combined() -> None:
    # top_k=3 leaves probs (0.5, 0.25, 0.125) / 0.875; top_p=0.6 then needs two of them.
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])
    counts = sample_many(probs.log(), 500, top_k=3, top_p=0.6)
    assert set(counts) == {0, 1}


def test_mixed_truncations_in_one_batch() -> None:
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    kinds: list[dict[str, Any]] = [{"top_k": 2}, {"top_p": 0.6}, {}, {"top_k": 3, "min_p": 0.4}]
    rows = [row(seed=s, **kinds[s % 4]) for s in range(800)]
    tokens = SAMPLER(probs.log().expand(800, -1), rows).token_ids
    seen = [
        {t for t, r in zip(tokens, rows, strict=True) if r.params == row(**k).params} for k in kinds
    ]
    assert seen == [{1, 3}, {1, 3}, {0, 1, 2, 3, 4}, {1, 3}]


def test_min_p_drops_unlikely_tokens() -> None:
    probs = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    # min_p=0.3: threshold 0.12 keeps ids 0, 1, 2.
    counts = sample_many(probs.log(), 2000, min_p=0.3)
    assert set(counts) == {0, 1, 2}
    kept = probs[:3] / probs[:3].sum()
    assert_follows(counts, kept, 2000)
    assert set(sample_many(probs.log(), 200, min_p=1.0)) == {0}


def test_penalties_exact_values() -> None:
    logits = torch.tensor(
        [
            [2.0, -1.0, 0.5, 3.0, -2.0, 0.0],
            [2.0, -1.0, 0.5, 3.0, -2.0, 0.0],
            [2.0, -1.0, 0.5, 3.0, -2.0, 0.0],
        ]
    )
    rows = [
        row(
            prompt=[0, 1],
            output=[1, 3, 3],
            repetition_penalty=2.0,
            frequency_penalty=0.5,
            presence_penalty=0.25,
        ),
        row(prompt=[0, 1], output=[1, 3, 3]),  # no penalties: untouched
        row(prompt=[5], output=[4, 4], presence_penalty=-1.0),  # only output tokens count
    ]
    out = apply_penalties(logits, rows)
    expected = torch.tensor(
        [
            # 0: prompt, 2/2; 1: -1*2 - 0.5 - 0.25; 3: 3/2 - 0.5*2 - 0.25
            [1.0, -2.75, 0.5, 0.25, -2.0, 0.0],
            [2.0, -1.0, 0.5, 3.0, -2.0, 0.0],
            [2.0, -1.0, 0.5, 3.0, -1.0, 0.0],
        ]
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert logits[0, 0] == 2.0  # input untouched


def test_repetition_penalty_below_one_boosts() -> None:
    logits = torch.tensor([[2.0, -1.0, 1.0]])
    out = apply_penalties(logits, [row(output=[0, 1], repetition_penalty=0.5)])
    torch.testing.assert_close(out, torch.tensor([[4.0, -0.5, 1.0]]))


def test_penalties_change_greedy_choice() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0, 0.0]])
    assert SAMPLER(logits, [row(temperature=0.0, output=[0])]).token_ids == [0]
    assert SAMPLER(logits, [row(temperature=0.0, output=[0], presence_penalty=0.5)]).token_ids == [
        1
    ]


def test_min_tokens_masks_eos_and_stop_ids() -> None:
    logits = torch.zeros(3, 10)
    rows = [
        row(output=[1], min_tokens=2, stop_token_ids=(3, 99)),  # 99: outside vocab, ignored
        row(output=[1, 2], min_tokens=2, stop_token_ids=(3,)),  # reached: nothing masked
        row(min_tokens=1, ignore_eos=True, stop_token_ids=(4,)),  # eos stays
    ]
    out = apply_min_tokens(logits, rows, [EOS])
    inf = float("-inf")
    assert out[0, EOS] == inf and out[0, 3] == inf
    assert torch.isfinite(out[0]).sum() == 8
    assert torch.isfinite(out[1]).all()
    assert out[2, 4] == inf and torch.isfinite(out[2]).sum() == 9


def test_min_tokens_in_sampling() -> None:
    logits = torch.full((1, 8), -5.0)
    logits[0, EOS] = 10.0
    logits[0, 2] = 9.0
    greedy = SAMPLER(logits, [row(temperature=0.0, min_tokens=1)]).token_ids
    assert greedy == [2]
    after = SAMPLER(logits, [row(temperature=0.0, min_tokens=1, output=[2])]).token_ids
    assert after == [EOS]
    ignoring = SAMPLER(logits, [row(temperature=0.0, min_tokens=1, ignore_eos=True)]).token_ids
    assert ignoring == [EOS]  # with ignore_eos, EOS is an ordinary token
    rows = [row(seed=s, min_tokens=3, stop_token_ids=(2,)) for s in range(200)]
    assert not {EOS, 2} & set(SAMPLER(logits.expand(200, -1), rows).token_ids)


def test_logprobs_are_raw_log_softmax() -> None:
    logits = random_logits(3, 12, seed=4)
    logits[1, 5] = logits[1, 6] = 10.0  # a tie: lower id first
    rows = [
        row(seed=1, logprobs=3, temperature=0.3, repetition_penalty=1.7, output=[0, 1]),
        row(temperature=0.0, logprobs=4),  # greedy still reports logprobs
        row(seed=2),  # not requested
    ]
    out = SAMPLER(logits, rows)
    raw = torch.log_softmax(logits, dim=-1)
    for i, k in ((0, 3), (1, 4)):
        token = out.token_ids[i]
        lp = out.logprobs[i]
        assert lp is not None
        assert lp == pytest.approx(float(raw[i, token]), abs=1e-6)
        top = out.top_logprobs[i]
        assert top is not None and len(top) == k
        expected_ids = sorted(range(12), key=lambda t: (-float(raw[i, t]), t))[:k]
        assert [t for t, _ in top] == expected_ids
        for t, v in top:
            assert v == pytest.approx(float(raw[i, t]), abs=1e-6)
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    assert out.token_ids[1] == 5 and [t for t, _ in out.top_logprobs[1] or []][:2] == [5, 6]
    assert out.logprobs[2] is None and out.top_logprobs[2] is None


def test_logprobs_zero_and_more_than_vocab() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.bfloat16)
    out = SAMPLER(logits, [row(temperature=0.0, logprobs=0)])
    assert out.token_ids == [2] and out.top_logprobs == [[]]
    raw = torch.log_softmax(logits.float(), dim=-1)[0]
    assert out.logprobs[0] == pytest.approx(float(raw[2]), abs=1e-6)
    out = SAMPLER(logits, [row(temperature=0.0, logprobs=20)])
    assert [t for t, _ in out.top_logprobs[0] or []] == [2, 1, 0]


@pytest.mark.parametrize("vocab", [49152, 640, 100])  # chunked (64 | vocab) and the plain path
def test_row_argmax_is_argmax_with_first_index_on_ties(vocab: int) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(9, vocab, generator=gen)
    x[1] = -torch.inf  # an all-masked row: index 0, as argmax
    x[2, :] = 0.0
    x[2, [5, 70, vocab - 1]] = 3.0  # ties across chunks: the first wins
    x[3, [vocab - 1, vocab - 2]] = 50.0  # the max in the last chunk
    x[4, 0] = 50.0
    x[5] = x[5].round()  # many ties everywhere
    got = row_argmax(x)
    assert got.tolist() == x.argmax(dim=-1).tolist()
    assert got[2].item() == 5
    assert row_argmax(x.to(torch.bfloat16)).tolist() == x.to(torch.bfloat16).argmax(-1).tolist()
