"""Structured output in the engine, on a tiny random Llama: a model whose free choice is noise,
so every well-formed answer below is the grammar's doing, in every sampling mode and schedule."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from surge.engine.llm import LLM
from surge.engine.sample.grammar import (
    GrammarCompiler,
    apply_token_bitmask_,
    token_bitmask,
    unpack_bitmask,
)
from surge.engine.sample.sampler import Sampler, SamplingRow
from surge.models.formats.model_files import open_model
from surge.sampling_params import SamplingParams
from surge.structured_output import StructuredOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["Hello", "Describe a person as JSON:", "1 2 3 4", "¿Qué tal?"]


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(str(tiny_model_dir), dtype="float32", max_num_batched_tokens=32)


def _texts(llm: LLM, params: SamplingParams, prompts: list[str] = PROMPTS) -> list[str]:
    return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_parses_and_follows_the_schema(llm: LLM, temperature: float) -> None:
    params = SamplingParams(temperature=temperature, max_tokens=200, seed=7,
                            structured=StructuredOutput.json_schema(SCHEMA))  # fmt: skip
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for out in outs:
        c = out.outputs[0]
        value = json.loads(c.text)  # whole: the request ended when the grammar did
        assert set(value) == {"name", "age", "tags"}
        assert isinstance(value["name"], str) and len(value["name"]) <= 12
        assert isinstance(value["age"], int) and 0 <= value["age"] <= 120
        assert set(value["tags"]) <= {"a", "b", "c"} and len(value["tags"]) <= 3
        assert c.finish_reason == "stop"


def test_regex_and_choice(llm: LLM) -> None:
    pattern = r"[A-Z]{2}-[0-9]{3}"
    regex = SamplingParams(temperature=0.8, max_tokens=20, seed=1,
                           structured=StructuredOutput("regex", pattern))  # fmt: skip
    for text in _texts(llm, regex):
        assert re.fullmatch(pattern, text), text
    choices = ["positive", "negative", "neutral"]
    choice = SamplingParams(temperature=1.0, max_tokens=20,
                            structured=StructuredOutput.choice(choices))  # fmt: skip
    assert all(t in choices for t in _texts(llm, choice))


def test_lark_grammar_and_json_object(llm: LLM) -> None:
    lark = 'start: "(" expr ")"\nexpr: NUMBER ("+" NUMBER)*\nNUMBER: /[0-9]{1,3}/'
    params = SamplingParams(temperature=1.0, max_tokens=40, seed=3,
                            structured=StructuredOutput("grammar", lark))  # fmt: skip
    for text in _texts(llm, params):
        assert re.fullmatch(r"\([0-9]{1,3}(\+[0-9]{1,3})*\)", text), text
    obj = SamplingParams(
        temperature=0.0, max_tokens=120, structured=StructuredOutput("json_object")
    )
    for out in llm.generate(PROMPTS, obj, use_tqdm=False):
        if out.outputs[0].finish_reason == "stop":  # a random model may nest past max_tokens
            assert isinstance(json.loads(out.outputs[0].text), dict)
        else:
            assert out.outputs[0].text.startswith("{")


def test_constrained_and_free_requests_share_a_batch(llm: LLM) -> None:
    """The mask touches only its own rows: a free greedy request gives the same tokens with or
    without constrained neighbours."""
    free = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    alone = llm.generate(PROMPTS[:2], free, use_tqdm=False)
    constrained = SamplingParams(temperature=0.0, max_tokens=16,
                                 structured=StructuredOutput("regex", "[a-z ]+"))  # fmt: skip
    mixed = llm.generate(PROMPTS[:2] * 2, [free, free, constrained, constrained], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:2]] == [o.outputs[0].token_ids for o in alone]
    for o in mixed[2:]:
        assert re.fullmatch("[a-z ]+", o.outputs[0].text)


def test_a_bad_grammar_is_refused(llm: LLM) -> None:
    for bad in (
        StructuredOutput("regex", "[a-"),
        StructuredOutput("json", '{"type": "wat"}'),
        StructuredOutput("json", "not json"),
        StructuredOutput("grammar", "start: undefined_rule"),
    ):
        with pytest.raises(ValueError, match=r"not valid|structured"):
            bad.grammar()
    with pytest.raises(ValueError, match="regex is not valid"):  # the engine refuses it too
        llm.generate(
            ["Hi"], SamplingParams(structured=StructuredOutput("regex", "(")), use_tqdm=False
        )
    with pytest.raises(ValueError):
        StructuredOutput("xml", "")
    with pytest.raises(ValueError):
        StructuredOutput.choice([])


def test_a_reasoning_model_thinks_before_the_constraint(llm: LLM) -> None:
    """thinking="optional" (Qwen3): free text inside <think>...</think> first, or the answer at
    once; "first" (DeepSeek-R1): the text starts inside the thinking. Either way the grammar
    holds from `</think>` on."""
    compiler = llm.engine.grammars
    json_answer = StructuredOutput.json_schema({"type": "object", "properties": {
        "a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False})  # fmt: skip
    cases = {
        "optional": {"<think>\nIt is {a: 5}?</think>\n\n{\"a\": 5}": True,
                     '{"a": 5}': True, "hmm</think>\n{\"a\": 5}": False,
                     "<think>x</think>{}": False},
        "first": {"<think>hmm</think>\n{\"a\": 5}": True, "hmm</think>\n{\"a\": 5}": True,
                  '{"a": 5}': False},
    }  # fmt: skip
    for thinking, texts in cases.items():
        structured = replace(json_answer, thinking=thinking)
        structured.grammar()  # valid
        for text, accepted in texts.items():
            m = compiler.matcher(structured)
            ids = llm.tokenizer.encode(text, add_special_tokens=False)
            ok = all(m.consume_token(t) for t in ids) and m.is_accepting()
            assert ok is accepted, (thinking, text)
    # In the engine: whatever the tiny model does first, the answer after any thinking is JSON.
    params = SamplingParams(temperature=1.0, max_tokens=120, seed=3,
                            structured=replace(json_answer, thinking="optional"))  # fmt: skip
    finished = 0
    for out in llm.generate(PROMPTS, params, use_tqdm=False):
        text = out.outputs[0].text
        if out.outputs[0].finish_reason == "stop":  # not cut by max_tokens while thinking
            answer = text.split("</think>", 1)[1] if text.startswith("<think>") else text
            assert isinstance(json.loads(answer.strip())["a"], int), text
            finished += 1
    assert finished >= 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_mask_picks_the_best_allowed_token(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    """Greedy under a mask = argmax over the allowed tokens; random draws stay inside it; the
    compiled mask and the torch one agree, and leave other rows alone."""
    tok = open_model(tiny_model_dir).tokenizer
    vocab = tok.backend.get_vocab_size()
    compiler = GrammarCompiler(tok, vocab, tuple(tok.eos_token_ids))
    grammar = StructuredOutput("regex", "(yes|no|maybe)")
    bits = token_bitmask([compiler.matcher(grammar), compiler.matcher(grammar)], vocab)
    allowed = unpack_bitmask(bits, vocab)[0]
    ids = allowed.nonzero().flatten().tolist()
    assert ids and all(re.match("(y|n|m)", tok.decode([i])) for i in ids)
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0)).to(dtype)
    masked = {}
    for use_kernel in (True, False):
        out = logits.clone()
        apply_token_bitmask_(out, [0, 2], bits, use_kernel=use_kernel)
        masked[use_kernel] = out
    assert torch.equal(masked[True], masked[False])
    out = masked[True]
    assert torch.equal(out[1], logits[1])  # the unconstrained row untouched
    assert torch.isinf(out[0]).sum().item() == vocab - len(ids)
    assert out[2].argmax().item() == max(ids, key=lambda i: logits[2, i].item())
    sampler = Sampler(tuple(tok.eos_token_ids), seed=0)
    for temperature in (0.0, 1.5):
        row = SamplingRow(SamplingParams(temperature=temperature), 5, [1], [],
                          compiler.matcher(grammar))  # fmt: skip
        picked = sampler(logits[2:].clone(), [row]).token_ids[0]
        assert picked in ids


def test_preempted_requests_keep_their_grammar_state(tiny_model_dir: Path) -> None:
    """A pool too small for all requests at once: some are preempted and recomputed midway,
    and their matchers, fed every token once, still end them inside the grammar."""
    llm = LLM(str(tiny_model_dir), dtype="float32", block_size=4, num_blocks=24,
              max_num_batched_tokens=16)  # fmt: skip
    pattern = r"([a-z]{3} ){6}[a-z]{3}"
    params = SamplingParams(temperature=1.0, max_tokens=40, seed=11,
                            structured=StructuredOutput("regex", pattern))  # fmt: skip
    outs = llm.generate([f"Request {i}: " + "words " * 6 for i in range(6)], params, use_tqdm=False)
    assert llm.engine.scheduler.stats.num_preemptions > 0
    for out in outs:
        assert re.fullmatch(pattern, out.outputs[0].text), out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"
