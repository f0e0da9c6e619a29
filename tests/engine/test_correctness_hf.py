"""The real SmolLM2-135M: greedy output token-identical to HF transformers, in every mode, fp32.

HF transformers loads the same GGUF (dequantized to fp32) and generates one prompt at a time;
Surge runs all prompts in one batch with the prefix cache on and off, with chunked prefill forced
tiny, and with a KV pool too small for the batch (preemption by recompute).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge.engine.llm import LLM
from surge.models.attention import AttnMetadata
from surge.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

MAX_TOKENS = 64
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis to a child.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What does a paged KV cache do in an LLM server?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "Write a Python function that reverses a string.",
]
RAW = [
    "Once upon a time",
    "The three laws of thermodynamics are",
    "def quicksort(arr):",
    "In 1969, the first humans",
    "Breaking news:",
    "1, 1, 2, 3, 5, 8,",
    "The best way to learn a language is " * 8,
    "Large language models are served to many users at once by batching requests. " * 12,
    "Q: What is 17 * 23?\nA:",
    "¿Dónde está la biblioteca? 图书馆在哪里？",
    "<html><body><h1>",
    "Dear hiring manager,",
]


@pytest.fixture(scope="module")
def prompts(smollm2_gguf_path: Path) -> list[list[int]]:
    from surge.models.formats.model_files import open_model

    tok = open_model(smollm2_gguf_path).tokenizer
    chats = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": q}]), False)
        for q in QUESTIONS
    ]
    return chats + [tok.encode(p) for p in RAW]


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf_path: Path) -> torch.nn.Module:
    """transformers reads the GGUF itself; its weights then go into a plain fp32 model, since
    transformers keeps GGUF weights packed and dequantizes them at every matmul (slow)."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    packed = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf_path.parent, gguf_file=smollm2_gguf_path.name, dtype=torch.float32
    )
    model = LlamaForCausalLM(packed.config)
    model.load_state_dict(packed.state_dict(), strict=False)
    model.tie_weights()
    model.generation_config.eos_token_id = None  # full length, like ignore_eos
    return model.eval()


def hf_generate(hf_model: torch.nn.Module, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        gen = hf_model.generate(  # type: ignore[operator]
            ids, max_new_tokens=MAX_TOKENS, do_sample=False, attention_mask=torch.ones_like(ids)
        )
    return list(gen[0, len(prompt) :].tolist())


@pytest.fixture(scope="module")
def llm(smollm2_gguf_path: Path) -> LLM:
    return LLM(str(smollm2_gguf_path), dtype="float32", quantization="none")


@pytest.fixture(scope="module")
def surge_greedy(prompts: list[list[int]], llm: LLM) -> list[list[int]]:
    """Surge's greedy outputs with the defaults (prefix cache on, one batch)."""
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def hf_greedy(
    hf_model: torch.nn.Module, prompts: list[list[int]], surge_greedy: list[list[int]]
) -> list[list[int]]:
    """HF's greedy continuation of every prompt, found by teacher forcing: one HF forward over
    prompt + a candidate continuation. Where HF's argmax at every position equals the candidate,
    HF's greedy decoding produces exactly that sequence (by induction over positions); anywhere
    else, HF's own generate() gives the reference. 64 generate() calls per prompt set cost ~2 min
    on 2 cores; this costs seconds and checks every position."""
    out = []
    for p, c in zip(prompts, surge_greedy, strict=True):
        with torch.no_grad():
            logits = hf_model(torch.tensor([p + c])).logits[0]  # type: ignore[operator]
        if logits[len(p) - 1 : len(p) - 1 + len(c)].argmax(-1).tolist() == c:
            out.append(c)
        else:
            out.append(hf_generate(hf_model, p))
    return out


@pytest.mark.long  # the reference harness itself: three generate() calls, ~50 s
def test_hf_generate_agrees_with_teacher_forcing(
    hf_model: torch.nn.Module, prompts: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """generate() itself on a few prompts (short, long, chat) gives the same reference."""
    for i in (0, 11, 17):
        assert hf_generate(hf_model, prompts[i]) == hf_greedy[i]


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_has_twenty_prompts_of_mixed_lengths(prompts: list[list[int]]) -> None:
    lengths = sorted(len(p) for p in prompts)
    assert len(prompts) >= 20 and lengths[0] < 8 and lengths[-1] > 150


def test_greedy_identical_to_transformers_with_the_defaults(
    surge_greedy: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """The defaults' run (prefix cache on) is the one hf_greedy checked position by position."""
    mismatches = [i for i, (a, b) in enumerate(zip(surge_greedy, hf_greedy, strict=True)) if a != b]
    assert not mismatches, f"prompts {mismatches} differ from transformers"


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {"enable_prefix_caching": False},
        # Tiny chunks and preemption by recompute: ~90 and ~65 s each on 2 cores (make test-long)
        pytest.param({"max_num_batched_tokens": 16}, marks=pytest.mark.long),
        pytest.param({"num_blocks": 48, "enable_prefix_caching": False}, marks=pytest.mark.long),
    ],
    ids=["no-prefix-cache", "chunked-16", "preemption"],
)
def test_greedy_identical_to_transformers(
    smollm2_gguf_path: Path,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    engine_kwargs: dict[str, object],
) -> None:
    engine = LLM(str(smollm2_gguf_path), dtype="float32", quantization="none", **engine_kwargs)
    outs = engine.generate(prompts, GREEDY, use_tqdm=False)  # type: ignore[arg-type]
    got = [o.outputs[0].token_ids for o in outs]
    mismatches = [i for i, (a, b) in enumerate(zip(got, hf_greedy, strict=True)) if a != b]
    assert not mismatches, f"prompts {mismatches} differ from transformers"
    if "num_blocks" in engine_kwargs:
        assert engine.engine.stats().scheduler.num_preemptions > 0


def test_max_logit_difference(
    llm: LLM, hf_model: torch.nn.Module, prompts: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """Logits of Surge's paged forward against HF's over prompt + continuation, every position."""
    worst = 0.0
    model = llm.engine.model
    k, _ = llm.engine.runner.kv_caches[0]
    for p, cont in list(zip(prompts, hf_greedy, strict=True))[::4]:
        ids = torch.tensor(p + cont)
        n = len(ids)
        with torch.no_grad():
            ref = hf_model(ids.unsqueeze(0)).logits[0]  # type: ignore[operator]
            attn = AttnMetadata(
                slot_mapping=torch.arange(n),
                decode_block_tables=torch.zeros((0, 1), dtype=torch.long),
                decode_seq_lens=torch.zeros(0, dtype=torch.long),
                decode_bias=torch.zeros((0, 1, 1)),
                prefills=(_chunk(n, k.shape[2]),),
                logits_indices=torch.arange(n),
                kv_caches=llm.engine.runner.kv_caches,
            )
            ours = model(ids, torch.arange(n), attn)
        worst = max(worst, (ours - ref).abs().max().item())
    print(f"\nmax |logit difference| vs transformers (fp32): {worst:.3e}")
    assert worst < 1e-3


def _chunk(n: int, block_size: int):  # type: ignore[no-untyped-def]
    from surge.models.attention import PrefillChunk

    return PrefillChunk(0, n, 0, torch.arange((n + block_size - 1) // block_size))
