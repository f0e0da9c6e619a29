"""The sampling contract: each logits processor's active()/apply() on plain tensors, and that the
sampler's greedy fast path never skips a processor that is active for a row."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from surge.engine.sample.logits_processors import (
    GrammarMask,
    MinTokens,
    Penalties,
    TokenRules,
    default_processors,
)
from surge.engine.sample.sampler import Sampler
from surge.engine.sample.sampling_row import SamplingRow
from surge.sampling_params import SamplingParams, effective_max_tokens

INF = float("-inf")
EOS = 7


def row(
    output: Sequence[int] = (),
    prompt: Sequence[int] = (1,),
    bad_words: tuple[tuple[int, ...], ...] = (),
    grammar: Any = None,
    **params: Any,
) -> SamplingRow:
    return SamplingRow(
        SamplingParams(**params), 0, tuple(prompt), tuple(output), grammar, bad_words
    )


def test_penalties() -> None:
    proc = Penalties()
    assert not proc.active(row())
    rows = [row(output=[2], presence_penalty=1.0), row(), row(prompt=[3], repetition_penalty=2.0)]
    assert [proc.active(r) for r in rows] == [True, False, True]
    logits = torch.zeros(3, 5) + torch.tensor([1.0, 1.0, 1.0, 4.0, 1.0])
    out = proc.apply(logits, rows, [0, 2])
    assert out[0].tolist() == [1.0, 1.0, 0.0, 4.0, 1.0]
    assert out[1].tolist() == [1.0, 1.0, 1.0, 4.0, 1.0]
    assert out[2].tolist() == [1.0, 1.0, 1.0, 2.0, 1.0]  # the prompt token 3 halved
    assert logits[0, 2] == 1.0  # not in place


def test_token_rules() -> None:
    proc = TokenRules()
    assert not proc.active(row())
    assert proc.active(row(logit_bias={1: 5.0})) and proc.active(row(allowed_token_ids=[2]))
    assert proc.active(row(bad_words=((3,),)))
    rows = [
        row(logit_bias={1: 5.0, 3: -2.0, 99: 1.0}),  # 99: past this vocab
        row(),
        row(allowed_token_ids=[0, 2, 50], logit_bias={0: 1.0}),
        # (3,): always banned; (1, 2): 2 banned only right after 1.
        row(output=[1], bad_words=((3,), (1, 2))),
        row(output=[2], bad_words=((1, 2),)),
    ]
    out = proc.apply(torch.zeros(5, 4), rows, [0, 2, 3, 4])
    assert out.tolist() == [
        [0.0, 5.0, 0.0, -2.0],
        [0.0] * 4,
        [1.0, INF, 0.0, INF],
        [0.0, 0.0, INF, INF],
        [0.0] * 4,
    ]


def test_min_tokens() -> None:
    proc = MinTokens([EOS])
    assert not proc.active(row(min_tokens=1, output=[5])) and proc.active(row(min_tokens=2))
    rows = [row(min_tokens=1, stop_token_ids=[2]), row(min_tokens=1, ignore_eos=True)]
    out = proc.apply(torch.zeros(2, 8), rows, [0, 1])
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [2, EOS]
    assert torch.isfinite(out[1]).all()


class _OnlyEven:
    """A stand-in for an llguidance matcher, which writes its bitmask through a pointer: allows
    the even tokens (0x55: bits 0, 2, 4 and 6 of each byte)."""

    def unsafe_compute_mask_ptr(self, ptr: int, nbytes: int) -> None:
        ctypes.memset(ptr, 0x55, nbytes)


@pytest.mark.parametrize("use_kernels", [True, False])
def test_grammar_mask(use_kernels: bool) -> None:
    proc = GrammarMask(use_kernels)
    assert not proc.active(row()) and proc.active(row(grammar=_OnlyEven()))
    logits = torch.ones(2, 40)
    rows = [row(), row(grammar=_OnlyEven())]
    out = proc.apply(logits, rows, [1])
    assert out.data_ptr() == logits.data_ptr()  # in place, as it declares
    assert torch.isfinite(out[0]).all()
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == list(range(0, 40, 2))


def test_every_logits_setting_has_an_active_processor() -> None:
    """Each setting that changes logits makes a default processor active: the greedy fast path
    skips only rows where none is."""
    procs = default_processors([EOS])
    changing = [
        row(repetition_penalty=1.1),
        row(presence_penalty=0.5),
        row(frequency_penalty=-0.5),
        row(logit_bias={3: 1.0}),
        row(allowed_token_ids=[3]),
        row(bad_words=((3,),)),
        row(min_tokens=1),
        row(grammar=_OnlyEven()),
    ]
    for r in changing:
        assert any(p.active(r) for p in procs), r
    assert not any(p.active(row(temperature=0.0, min_tokens=1, output=[4])) for p in procs)


class _ForceToken:
    """A new processor: makes `token` win for the rows whose seed is `seed`."""

    in_place = False

    def __init__(self, token: int, seed: int, masks_only: bool = False) -> None:
        self.token, self.seed, self.masks_only = token, seed, masks_only
        self.calls = 0

    def active(self, r: SamplingRow) -> bool:
        return r.seed == self.seed

    def apply(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow], active: Sequence[int]
    ) -> torch.Tensor:
        self.calls += 1
        assert list(active) == [i for i, r in enumerate(rows) if r.seed == self.seed]
        out = logits.clone()
        out[list(active), self.token] = 1e4
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masks_only", [False, True])
def test_a_registered_processor_applies_to_greedy_rows(
    dtype: torch.dtype, masks_only: bool
) -> None:
    """The contract: adding a processor to the list is all it takes, also for greedy rows."""
    force = _ForceToken(token=5, seed=1, masks_only=masks_only)
    sampler = Sampler([EOS], processors=[*default_processors([EOS]), force])
    logits = torch.zeros(3, 16, dtype=dtype)
    logits[:, 2] = 10.0
    greedy = [SamplingRow(SamplingParams(temperature=0.0), s, (1,), ()) for s in (0, 1, 2)]
    assert sampler(logits.clone(), greedy).token_ids == [2, 5, 2]
    # A batch it is active for no row of: not called at all.
    assert force.calls == 1
    assert sampler(logits[:2].clone(), [greedy[0], greedy[2]]).token_ids == [2, 2]
    assert force.calls == 1
    # Beside a sampled row and a logprobs row; logprobs still report the raw model.
    mixed = [
        SamplingRow(SamplingParams(temperature=0.0, logprobs=1), 1, (1,), ()),
        SamplingRow(SamplingParams(temperature=1.0, top_k=3, seed=3), 1, (1,), ()),
    ]
    out = sampler(logits[:2].clone(), mixed)
    assert out.token_ids == [5, 5]
    assert out.top_logprobs[0] is not None and out.top_logprobs[0][0][0] == 2


def test_an_in_place_processor_leaves_the_raw_logits_for_logprobs() -> None:
    """GrammarMask writes in place: beside a logprobs row the sampler hands it a copy."""
    logits = torch.zeros(1, 40)
    logits[0, 1] = 5.0  # odd: the grammar forbids it
    r = row(grammar=_OnlyEven(), temperature=0.0, logprobs=1)
    out = Sampler([EOS])(logits, [r])
    assert out.token_ids[0] % 2 == 0
    assert out.top_logprobs[0] is not None and out.top_logprobs[0][0][0] == 1  # raw best


def test_effective_max_tokens() -> None:
    assert effective_max_tokens(None, room=10) == 10  # absent: all the room
    assert effective_max_tokens(None, room=10, default=4) == 4  # the server's default
    assert effective_max_tokens(None, room=10, default=50) == 10  # ... within the room
    assert effective_max_tokens(5, room=10, default=4) == 5  # the request's own wins
    assert effective_max_tokens(50, room=10) == 10  # the engine clamps (the server 400s first)
