"""Batch-invariant mode: a request's greedy tokens are the same alone and among others, on the
fused 4-bit stack, with the engine's flag and with the request's own; and where the mode cannot
hold (no fused stack) the engine says so instead of running without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge import LLM, SamplingParams
from surge.engine.client.outputs import EngineCoreRequest
from surge.models.kernels import load_paged_decode, load_q4_decode
from tests.conftest import write_tiny_llama

module = load_q4_decode()
needs_stack = pytest.mark.skipif(
    module is None or not module.supported or load_paged_decode() is None,
    reason="needs the C++ toolchain and AVX-512 VNNI or AVX2",
)

# The smallest Llama the fused stack takes: head size 64, every width a multiple of 64.
CONFIG = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64}  # fmt: skip
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "Batching requests together",
    "A long time ago in a galaxy far, far away, there was",
    "def fibonacci(n):",
    "Red, green, blue,",
    "Q: What is two plus two? A:",
]


@pytest.fixture(scope="module")
def stack_model_dir(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's tokenizer with random weights of `CONFIG`'s shapes."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-stack"), smollm2_gguf_path, 1, CONFIG)


def greedy(per_request: bool) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                          batch_invariant=per_request)  # fmt: skip


def alone_and_together(llm: LLM, params: SamplingParams) -> tuple[list[list[int]], ...]:
    alone = [llm.generate([p], params, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
    together = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    return alone, together


@needs_stack
def test_engine_flag_same_tokens_alone_and_together(stack_model_dir: Path) -> None:
    llm = LLM(str(stack_model_dir), quantization="q4", batch_invariant=True)
    fused = llm.engine.runner.fused
    assert fused is not None
    rows: list[int] = []
    if fused.invariant is not None:  # int8 copies (AVX-512 VNNI): every step on that stack
        invariant = fused.invariant
        fused.stack = None  # a step on the other stack would fail

        class Counting:
            def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
                rows.append(x.shape[0])
                return invariant.forward(x, *rest)

        fused.invariant = Counting()
    alone, together = alone_and_together(llm, greedy(False))
    assert together == alone
    assert all(len(t) == 12 for t in alone)
    if fused.invariant is not None:
        assert 1 in rows and len(PROMPTS) in rows  # one-row decodes and full-batch decodes


@needs_stack
def test_request_flag_same_tokens_alone_and_together(stack_model_dir: Path) -> None:
    """The request's own flag on an engine without the mode: its steps take the invariant
    stack; the others' do not (a step of a few rows without it stays on the 4-bit weights)."""
    llm = LLM(str(stack_model_dir), quantization="q4")
    assert llm.engine.runner.fused is not None
    alone, together = alone_and_together(llm, greedy(True))
    assert together == alone


def test_flag_refused_without_the_fused_stack(tiny_model_dir: Path) -> None:
    """The tiny model's head size (16) is not the stack's: the mode cannot hold there."""
    with pytest.raises(ValueError, match="batch-invariant"):
        LLM(str(tiny_model_dir), quantization="q4", batch_invariant=True)
    llm = LLM(str(tiny_model_dir), quantization="q4")
    with pytest.raises(ValueError, match="batch-invariant"):
        llm.engine.add_request(EngineCoreRequest("r", [1, 2, 3], greedy(True)))
