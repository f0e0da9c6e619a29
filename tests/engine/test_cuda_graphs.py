"""The CUDA graphs' static-buffer decode step, run eagerly on the CPU (capture=False): padded
rows, tables widened to a power of two with stale columns, the mask made from the lengths; the
same tokens as the plain step. tests/engine/test_cuda.py replays the graphs on a GPU."""

from __future__ import annotations

from pathlib import Path

import torch

from surge import LLM, SamplingParams
from surge.engine.runner.cuda_graphs import DecodeGraphs

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Paged attention keeps the KV cache in fixed-size blocks, " * 4,
    "¿Qué tal? 你好，世界 🌍",
    "One two three",
]


def test_static_buffer_steps_give_the_plain_steps_tokens(tiny_model_dir: Path) -> None:
    # On the CPU even where there is a GPU: this is the step without its capture.
    kw: dict[str, object] = {
        "dtype": "float32",
        "device": "cpu",
        "block_size": 4,
        "num_blocks": 160,
    }
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ref = LLM(str(tiny_model_dir), **kw)
    llm = LLM(str(tiny_model_dir), max_num_seqs=5, use_kernels=False, **kw)
    runner = llm.engine.runner
    graphs = DecodeGraphs(
        runner.model,
        runner.kv_caches,
        4,
        5,
        llm.engine.max_model_len // 4,
        runner.scratch_slot,
        torch.device("cpu"),
        capture=False,
    )
    runner.use_paths(fused=runner.fused, graphs=graphs)
    assert graphs.buckets == (1, 2, 4, 8)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in ref.generate(PROMPTS, params, use_tqdm=False)]
    assert got == want
    rows = {r for r, _ in graphs.steps}
    widths = {w for _, w in graphs.steps}
    assert 8 in rows  # 5 running decodes padded to 8
    assert len(widths) >= 3 and all(w & (w - 1) == 0 for w in widths)


def test_rows_past_the_largest_bucket_take_no_graph() -> None:
    graphs = DecodeGraphs(
        lambda *a: torch.zeros(0), [], 16, 100, 512, 0, torch.device("cpu"), capture=False
    )
    assert graphs.buckets[-1] == 112 and graphs.max_width == 512
    assert graphs.rows_for(3) == 4 and graphs.rows_for(100) == 112 and graphs.rows_for(113) is None
    assert graphs.rows_for(3, 512) == 4 and graphs.rows_for(3, 513) is None
