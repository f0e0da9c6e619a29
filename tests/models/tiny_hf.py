"""Tiny random transformers models saved as HF folders with the tiny Llama's tokenizer (SmolLM2's),
for architecture tests against transformers itself: its greedy tokens, and Surge's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from surge.engine.llm import LLM
from surge.sampling_params import SamplingParams

# Three prompts of 5, 21 and 40 token ids (spread over the vocabulary, no special tokens).
PROMPTS = [[(37 * i + 11) % 5000 + 100 for i in range(n)] for n in (5, 21, 40)]


def tokenizer_vocab(tiny_model_dir: Path) -> int:
    """The vocabulary size of the tokenizer in `tiny_model_dir` (added tokens included)."""
    tok_json = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    return len(tok_json["model"]["vocab"]) + len(tok_json.get("added_tokens", []))


def save_with_tokenizer(model: Any, folder: Path, tiny_model_dir: Path) -> Path:
    """`model.save_pretrained(folder)` with the tiny Llama's tokenizer files beside it."""
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny_model_dir / name).read_bytes())
    return folder


def hf_greedy(model_cls: Any, folder: Path, max_tokens: int) -> list[list[int]]:
    """transformers' greedy continuations of PROMPTS, one prompt at a time (no padding)."""
    ref = model_cls.from_pretrained(folder, dtype=torch.float32).eval()
    return [
        ref.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                     min_new_tokens=max_tokens)[0, len(p) :].tolist()
        for p in PROMPTS
    ]  # fmt: skip


def assert_surge_greedy(folder: Path, expected: list[list[int]], max_tokens: int) -> None:
    """Surge's greedy continuations of PROMPTS are `expected`: in one batch, and through
    chunked prefill (6 tokens a step) with a prefix-cache hit on a repeat of the longest."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for kwargs in ({}, {"max_num_batched_tokens": 6, "block_size": 4}):
        llm = LLM(model=str(folder), dtype="float32", kv_cache_memory_gib=0.05, **kwargs)  # type: ignore[arg-type]
        outs = llm.generate([*PROMPTS, PROMPTS[2]], params, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        assert got[:3] == expected, kwargs
        assert got[3] == expected[2]
