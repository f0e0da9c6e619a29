"""Offline LLM on a tiny random Llama: token-identical to HF transformers in every schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Paged attention keeps the KV cache in fixed-size blocks, " * 6,
    "¿Qué tal? 你好，世界 🌍",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def hf_reference(tiny_model_dir: Path) -> list[list[int]]:
    """Greedy continuations from HF transformers, one prompt at a time (no padding effects)."""
    from transformers import AutoModelForCausalLM

    from surge.models.formats.model_files import open_model

    tok = open_model(tiny_model_dir).tokenizer
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # run the full length, like ignore_eos
    out = []
    for p in PROMPTS:
        ids = torch.tensor([tok.encode(p)])
        with torch.no_grad():
            gen = model.generate(
                ids, max_new_tokens=MAX_TOKENS, do_sample=False, attention_mask=torch.ones_like(ids)
            )
        out.append(gen[0, ids.shape[1] :].tolist())
    return out


def run_greedy(tiny_model_dir: Path, **engine_kwargs: object) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(tiny_model_dir), dtype="float32", **engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {},
        {"enable_prefix_caching": False},
        {"max_num_batched_tokens": 16},
        {"block_size": 4, "num_blocks": 40, "enable_prefix_caching": False},
        {"block_size": 4, "num_blocks": 40},
        {"use_kernels": False, "max_num_batched_tokens": 16},
    ],
    ids=["default", "no-prefix-cache", "chunked-16", "preempt", "preempt-cached", "torch-ops"],
)
def test_greedy_matches_transformers(
    tiny_model_dir: Path, hf_reference: list[list[int]], engine_kwargs: dict[str, object]
) -> None:
    llm, got = run_greedy(tiny_model_dir, **engine_kwargs)
    assert got == hf_reference
    stats = llm.engine.stats()
    if "num_blocks" in engine_kwargs:
        assert stats.scheduler.num_preemptions > 0  # the small pool really forced preemption
    assert stats.kv_cache_usage == 0.0  # everything freed at the end


def test_prefix_cache_hits_on_shared_prompt(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32")
    prompt = PROMPTS[4]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    first = llm.generate(prompt, params, use_tqdm=False)[0]
    second = llm.generate(prompt, params, use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    n = len(first.prompt_token_ids)
    # Every token but the last: the full blocks shared, then the first request's block after
    # them (its prompt's tail and the tokens it generated) copied for its first tokens.
    assert n % 16 != 1 and second.num_cached_tokens == n - 1
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32")
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16)
    alone = llm.generate(PROMPTS[1], params, use_tqdm=False)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=16)
    batch = llm.generate(PROMPTS, [others, params, others, others, others, others], False)
    assert batch[1].outputs[0].token_ids == alone


def test_n_samples_share_prompt_and_differ(tiny_model_dir: Path) -> None:
    for caching in (True, False):
        llm = LLM(str(tiny_model_dir), dtype="float32", enable_prefix_caching=caching)
        params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=12)
        out = llm.generate(PROMPTS[4], params, use_tqdm=False)[0]
        seqs = [o.token_ids for o in out.outputs]
        assert len(seqs) == 4 and all(len(s) == 12 for s in seqs)
        assert len({tuple(s) for s in seqs}) > 1
        assert llm.engine.stats().kv_cache_usage == 0.0


def test_stop_string_is_never_emitted(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32")
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    full = llm.generate(PROMPTS[0], greedy, use_tqdm=False)[0].outputs[0].text
    stop = full[5:9]  # a piece of text that spans into the middle of the output
    assert stop
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=[stop])
    out = llm.generate(PROMPTS[0], params, use_tqdm=False)[0].outputs[0]
    assert out.text == full[: full.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert llm.engine.stats().kv_cache_usage == 0.0


def test_max_and_min_tokens_and_logprobs(tiny_model_dir: Path) -> None:
    llm = LLM(str(tiny_model_dir), dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=5, logprobs=3)
    out = llm.generate(PROMPTS[2], params, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert out.logprobs is not None and len(out.logprobs) == 5
    for tok, lp in zip(out.token_ids, out.logprobs, strict=True):
        assert len(lp.top) == 3
        assert lp.top[0][0] == tok  # greedy picks the most likely token
        assert lp.logprob == pytest.approx(lp.top[0][1])


def test_chat_renders_the_template_and_generates(tiny_model_dir: Path) -> None:
    """LLM.chat: one conversation or several, each the chat template's text, no BOS twice."""
    llm = LLM(str(tiny_model_dir), dtype="float32")
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    talk = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    other = [{"role": "user", "content": "Name a color."}]
    text = llm.tokenizer.apply_chat_template(talk)
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    (one,) = llm.chat(talk, params, use_tqdm=False)
    assert one.prompt == text and one.prompt_token_ids == ids
    (expected,) = llm.generate([ids], params, use_tqdm=False)
    assert one.outputs[0].token_ids == expected.outputs[0].token_ids
    both = llm.chat([talk, other], params, use_tqdm=False)
    assert both[0].prompt_token_ids == ids and len(both) == 2
    assert both[1].prompt == llm.tokenizer.apply_chat_template(other)


@pytest.mark.parametrize("kv", ["auto", "bfloat16", "int8"])
def test_a_follow_up_reuses_the_finished_requests_last_block(tiny_model_dir: Path, kv: str) -> None:
    """A follow-up turn computes only its new tokens: the first request's last, partial block
    is copied for the tokens they share, and the answer is the one computed from scratch."""
    cached = LLM(str(tiny_model_dir), dtype="float32", kv_cache_dtype=kv)
    fresh = LLM(str(tiny_model_dir), dtype="float32", kv_cache_dtype=kv,
                enable_prefix_caching=False)  # fmt: skip
    first = cached.tokenizer.encode(PROMPTS[4])
    n = len(first)
    assert n % 16 > 1  # a partial last block to keep
    once = SamplingParams(temperature=0.0, max_tokens=1)  # the prompt computed, nothing more
    cached.generate(first, once, use_tqdm=False)
    follow_up = first + cached.tokenizer.encode("Blocks are shared by requests.")
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, ignore_eos=True)
    got = cached.generate(follow_up, params, use_tqdm=False)[0]
    ref = fresh.generate(follow_up, params, use_tqdm=False)[0]
    assert got.num_cached_tokens == n  # every token of the first prompt, none more
    assert got.outputs[0].token_ids == ref.outputs[0].token_ids
    assert got.outputs[0].logprobs is not None and ref.outputs[0].logprobs is not None
    a = [lp.logprob for lp in got.outputs[0].logprobs]
    b = [lp.logprob for lp in ref.outputs[0].logprobs]
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 2e-5
