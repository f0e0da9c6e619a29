"""logit_bias, allowed_token_ids and bad_words in the sampler (vLLM / OpenAI semantics), and the
bad words as the real tokenizer spells them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from surge.engine.sample.sampler import Sampler, SamplingRow
from surge.engine.sample.token_rules import encode_bad_words
from surge.models.formats.model_files import open_model
from surge.sampling_params import SamplingParams

SAMPLER = Sampler(eos_token_ids=[7])


def _logits(rows: int = 1, vocab: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2.0


def _row(output: tuple[int, ...] = (), bad: tuple[tuple[int, ...], ...] = (), **params: object):
    return SamplingRow(SamplingParams(**params), 0, (1,), output, bad_words=bad)  # type: ignore[arg-type]


def test_logit_bias_moves_greedy_and_random_choices_and_logprobs_stay_raw() -> None:
    logits = _logits()
    best = int(logits.argmax())
    other = (best + 1) % 32
    out = SAMPLER(logits.clone(), [_row(temperature=0.0, logprobs=1, logit_bias={other: 100})])
    assert out.token_ids == [other]
    raw = torch.log_softmax(logits[0], dim=-1)
    assert out.logprobs[0] == pytest.approx(float(raw[other]), abs=1e-5)  # the model's own
    # -100 takes the best token away; string keys (JSON's) are token ids too.
    banned = SAMPLER(logits.clone(), [_row(temperature=0.0, logit_bias={str(best): -100})])
    assert banned.token_ids[0] != best
    assert SamplingParams(logit_bias={"3": 1.5}).logit_bias == ((3, 1.5),)


def test_allowed_token_ids_hold_random_sampling_per_row() -> None:
    logits = _logits(rows=1).repeat(400, 1)
    held_params = SamplingParams(temperature=1.0, allowed_token_ids=[3, 5, 11])
    free_params = SamplingParams(temperature=1.0)
    rows = [SamplingRow((held_params, free_params)[i % 2], i, (1,), ()) for i in range(400)]
    out = SAMPLER(logits, rows)
    held, free = Counter(out.token_ids[0::2]), Counter(out.token_ids[1::2])
    assert set(held) <= {3, 5, 11} and len(held) > 1
    assert len(set(free) - {3, 5, 11}) > 3  # the other row is not held


def test_bad_words_ban_a_last_token_only_after_its_prefix() -> None:
    logits = torch.full((1, 32), -5.0)
    logits[0, 9] = 5.0  # greedy picks 9
    word = ((4, 9),)  # the word is tokens 4 then 9
    assert SAMPLER(logits.clone(), [_row((1, 2), word, temperature=0.0)]).token_ids == [9]
    after_prefix = SAMPLER(logits.clone(), [_row((1, 4), word, temperature=0.0)]).token_ids
    assert after_prefix != [9]
    one_token = SAMPLER(logits.clone(), [_row((), ((9,),), temperature=0.0)]).token_ids
    assert one_token != [9]


def test_token_rule_validation() -> None:
    with pytest.raises(ValueError, match="logit_bias values must be in"):
        SamplingParams(logit_bias={1: 101})
    with pytest.raises(ValueError, match="logit_bias keys must be token ids"):
        SamplingParams(logit_bias={"x": 1})
    with pytest.raises(ValueError, match="allowed_token_ids must not be empty"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="bad_words must contain only non-empty"):
        SamplingParams(bad_words=[" "])
    with pytest.raises(ValueError, match=r"allowed_token_ids has token ids outside .*\[40\]"):
        SamplingParams(allowed_token_ids=[1, 40]).check_vocab(32)


def test_bad_words_are_encoded_alone_and_after_a_space(smollm2_gguf_path: Path) -> None:
    tok = open_model(smollm2_gguf_path).tokenizer
    seqs = encode_bad_words(["Paris", " hello world"], tok)
    expected = {
        tuple(tok.encode(t, add_special_tokens=False))
        for t in ("Paris", " Paris", "hello world", " hello world")
    }
    assert set(seqs) == expected and len(seqs) == 4
