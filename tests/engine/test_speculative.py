"""Speculative decoding: prompt-lookup drafts, verified so that the output is the one decoding
without drafts gives (greedy, seeded sampling, penalties, logprobs, stops, max_tokens,
preemption), whatever the drafts. (The real SmolLM2 copying its prompt with drafts accepted:
tests/server/test_speculative.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from surge.engine.core import ngram
from surge.engine.core.ngram import NgramIndex
from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
]
MAX_TOKENS = 40


def test_ngram_index_proposes_what_followed_the_suffix() -> None:
    idx = NgramIndex(min_n=2, max_n=3)
    seq = [1, 2, 3, 4, 5, 9, 2, 3]
    assert idx.propose(seq, 3) == [4, 5, 9]  # "2 3" ended at index 2: then 4 5 9
    assert idx.propose(seq, 1) == [4]
    seq += [7, 1, 2, 3]  # "1 2 3" (the longest n) last ended at index 2; "2 3" later at 7
    assert idx.propose(seq, 2) == [4, 5]
    seq += [8]
    assert idx.propose(seq, 4) == []  # "3 8" and "2 3 8" never occurred before
    assert NgramIndex(2, 3).propose([5, 6, 5, 6], 4) == [
        5,
        6,
    ]  # a repeat runs into the suffix itself
    assert NgramIndex(1, 1).propose([4], 2) == []
    with pytest.raises(ValueError):
        NgramIndex(3, 2)


class Oracle:
    """Drafts from the known answer, every third one wrong at its last token: the verifier must
    accept exactly the right prefix (a stand-in proposer, so that the tiny random model, whose
    outputs rarely repeat, gets drafts at every step)."""

    answers: ClassVar[dict[tuple[int, ...], list[int]]] = {}  # prompt -> the plain output

    def __init__(self, min_n: int, max_n: int) -> None:
        self.calls = 0

    @classmethod
    def teach(cls, llm: LLM, outs: list) -> None:  # type: ignore[type-arg]
        """The answers: each prompt's first output from a run without drafts."""
        tok = llm.tokenizer
        cls.answers = {
            tuple(tok.encode(p)): o.outputs[0].token_ids for p, o in zip(PROMPTS, outs, strict=True)
        }

    def propose(self, tokens: list[int], k: int) -> list[int]:
        for prompt, answer in self.answers.items():
            if tuple(tokens[: len(prompt)]) == prompt:
                done = len(tokens) - len(prompt)
                draft = list(answer[done : done + k])
                self.calls += 1
                if draft and self.calls % 3 == 0:
                    draft[-1] = (draft[-1] + 1) % 1000
                return draft
        return []


@pytest.fixture
def oracle(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Oracle]]:
    Oracle.answers = {}
    monkeypatch.setattr(ngram, "NgramIndex", Oracle)
    monkeypatch.setattr("surge.engine.core.scheduler.NgramIndex", Oracle)
    yield Oracle


def _run(model: Path, params: SamplingParams, **kwargs: object) -> tuple[LLM, list]:  # type: ignore[type-arg]
    llm = LLM(str(model), dtype="float32", **kwargs)
    return llm, llm.generate(PROMPTS, params, use_tqdm=False)


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=11, max_tokens=MAX_TOKENS,
                        ignore_eos=True)  # fmt: skip
PENALTIES = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                           repetition_penalty=1.3, frequency_penalty=0.5, logprobs=2)  # fmt: skip
CHUNKED = {"max_num_batched_tokens": 16}
PREEMPT = {"block_size": 4, "num_blocks": 40}


@pytest.mark.parametrize(
    ("params", "engine_kwargs"),
    [(GREEDY, PREEMPT), (SEEDED, CHUNKED), (PENALTIES, {})],
    ids=["greedy-preempt", "seeded-chunked", "penalties-logprobs"],
)
def test_drafts_never_change_the_output(
    tiny_model_dir: Path,
    oracle: type[Oracle],
    params: SamplingParams,
    engine_kwargs: dict[str, object],
) -> None:
    plain_llm, plain = _run(tiny_model_dir, params, **engine_kwargs)
    oracle.teach(plain_llm, plain)
    llm, spec = _run(tiny_model_dir, params, num_speculative_tokens=4, **engine_kwargs)
    for a, b in zip(plain, spec, strict=True):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert b.outputs[0].finish_reason == a.outputs[0].finish_reason
        if params.logprobs is not None:
            assert a.outputs[0].logprobs is not None and b.outputs[0].logprobs is not None
            for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
                assert abs(x.logprob - y.logprob) < 1e-4
                assert [t for t, _ in x.top] == [t for t, _ in y.top]
    stats = llm.engine.stats()
    # Drafts at almost every step, two in three wholly right: far fewer steps than tokens.
    assert stats.spec.num_drafts > 0
    assert stats.spec.accepted_tokens > stats.spec.draft_tokens // 2
    assert stats.steps.num_steps < plain_llm.engine.stats().steps.num_steps
    assert stats.steps.generation_tokens == plain_llm.engine.stats().steps.generation_tokens
    if "num_blocks" in engine_kwargs:
        assert stats.scheduler.num_preemptions > 0
    assert stats.kv_cache_usage == 0.0


def test_a_stop_inside_an_accepted_draft_ends_there(
    tiny_model_dir: Path, oracle: type[Oracle]
) -> None:
    plain_llm, plain = _run(tiny_model_dir, GREEDY)
    oracle.teach(plain_llm, plain)
    # Stop at the 10th token of each answer, and cap at 23 tokens: both land mid-draft.
    llm = LLM(str(tiny_model_dir), dtype="float32", num_speculative_tokens=6)
    for i, out in enumerate(plain):
        stop = out.outputs[0].token_ids[9]
        params = SamplingParams(temperature=0.0, max_tokens=23, ignore_eos=True,
                                stop_token_ids=[stop])  # fmt: skip
        want = plain_llm.generate(PROMPTS[i], params, use_tqdm=False)[0].outputs[0]
        got = llm.generate(PROMPTS[i], params, use_tqdm=False)[0].outputs[0]
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
        assert len(got.token_ids) <= 23


def test_no_drafts_for_structured_output_or_big_batches(tiny_model_dir: Path) -> None:
    from surge.structured_output import StructuredOutput

    llm = LLM(str(tiny_model_dir), dtype="float32", num_speculative_tokens=4,
              disable_by_batch_size=2)  # fmt: skip
    loop = "a b c a b c a b c a b c"
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate([loop] * 3, params, use_tqdm=False)  # 3 running > 2: no drafts
    assert llm.engine.stats().spec.num_drafts == 0
    choice = StructuredOutput.choice(["a b c a b c", "x y z"])
    constrained = SamplingParams(temperature=0.0, max_tokens=8, structured=choice)
    llm.generate([loop], constrained, use_tqdm=False)
    assert llm.engine.stats().spec.num_drafts == 0


def test_a_stop_string_inside_an_accepted_draft_ends_there(
    tiny_model_dir: Path, oracle: type[Oracle]
) -> None:
    plain_llm, plain = _run(tiny_model_dir, GREEDY)
    oracle.teach(plain_llm, plain)
    llm = LLM(str(tiny_model_dir), dtype="float32", num_speculative_tokens=6)
    tok = plain_llm.tokenizer
    checked = 0
    for i, out in enumerate(plain):
        stop = tok.decode(out.outputs[0].token_ids[12:14]).strip()
        if len(stop) < 2:
            continue
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                stop=[stop])  # fmt: skip
        want = plain_llm.generate(PROMPTS[i], params, use_tqdm=False)[0].outputs[0]
        got = llm.generate(PROMPTS[i], params, use_tqdm=False)[0].outputs[0]
        assert got.text == want.text and got.token_ids == want.token_ids
        assert got.finish_reason == "stop"
        checked += 1
    assert checked >= 2


def test_drafts_with_lora_adapters_and_n(
    tiny_model_dir: Path, oracle: type[Oracle], tmp_path: Path
) -> None:
    """Drafts on adapter rows (their own slot in the verifying chunk) and on n = 2 siblings
    sharing a prompt: the same outputs as without drafts."""
    from tests.lora_adapters import write_peft_adapter

    adapter = str(write_peft_adapter(tiny_model_dir, tmp_path / "a", r=4, seed=5))
    params = SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=24, ignore_eos=True)
    names = ["a", None, "a", None]
    plain_llm = LLM(str(tiny_model_dir), dtype="float32", lora_modules={"a": adapter})
    plain = plain_llm.generate(PROMPTS, params, use_tqdm=False, lora_name=names)
    # The oracle knows one answer per prompt: the first sibling's (the second's drafts miss).
    oracle.teach(plain_llm, plain)
    llm = LLM(str(tiny_model_dir), dtype="float32", lora_modules={"a": adapter},
              num_speculative_tokens=4)  # fmt: skip
    spec = llm.generate(PROMPTS, params, use_tqdm=False, lora_name=names)
    for a, b in zip(plain, spec, strict=True):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert llm.engine.stats().spec.accepted_tokens > 0
