"""The engine on a CUDA GPU: precision chosen by compute capability, the same tokens as the CPU,
decode steps replayed from CUDA graphs, the real model's answer in bf16. Skipped where torch sees
no GPU (CI); the rest of the suite runs on the GPU too where there is one (device "auto")."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from surge import LLM, SamplingParams
from surge.engine.llm import RequestOutput
from surge.models.device import choose_precision

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "Paged attention keeps the KV cache in fixed-size blocks, " * 6,
]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=0)


def greedy(llm: LLM, prompts: list[str], params: SamplingParams = GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def assert_same_tokens_and_logprobs(
    got: list[RequestOutput], ref: list[RequestOutput], tol: float
) -> None:
    for g, r in zip(got, ref, strict=True):
        assert g.outputs[0].token_ids == r.outputs[0].token_ids
        assert g.outputs[0].logprobs is not None and r.outputs[0].logprobs is not None
        for a, b in zip(g.outputs[0].logprobs, r.outputs[0].logprobs, strict=True):
            assert a.logprob == pytest.approx(b.logprob, abs=tol)


def test_auto_precision_follows_this_gpus_compute_capability() -> None:
    p = choose_precision("auto", "auto")
    assert p.device.type == "cuda" and p.caps is not None
    major, minor = torch.cuda.get_device_capability()
    assert p.caps.features[0] == f"sm{major}{minor}"
    assert p.dtype == (torch.bfloat16 if major >= 8 else torch.float16)
    assert p.caps.fp8 == ((major, minor) >= (8, 9))
    assert p.caps.memory_bytes == torch.cuda.get_device_properties(0).total_memory


def test_float32_on_the_gpu_gives_the_cpus_tokens_and_logprobs(tiny_model_dir: Path) -> None:
    gpu = LLM(str(tiny_model_dir), dtype="float32", num_blocks=128)
    cpu = LLM(str(tiny_model_dir), dtype="float32", device="cpu", num_blocks=128)
    assert gpu.engine.runner.kv_caches[0][0].device.type == "cuda"
    got = gpu.generate(PROMPTS, GREEDY, use_tqdm=False)
    ref = cpu.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_same_tokens_and_logprobs(got, ref, 2e-3)


def test_an_int8_kv_cache_on_the_gpu_gives_the_cpus_tokens(tiny_model_dir: Path) -> None:
    """The int8 cache's rows are quantized and read in torch ops on a GPU (CUDA graphs too),
    by the compiled kernels on the CPU: the same numbers either way."""
    gpu = LLM(str(tiny_model_dir), dtype="float32", kv_cache_dtype="int8", num_blocks=128)
    cpu = LLM(str(tiny_model_dir), dtype="float32", kv_cache_dtype="int8", device="cpu",
              num_blocks=128)  # fmt: skip
    assert gpu.engine.runner.kv_caches[0][0].dtype == torch.int8
    got = gpu.generate(PROMPTS, GREEDY, use_tqdm=False)
    ref = cpu.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_same_tokens_and_logprobs(got, ref, 2e-3)


def test_compiled_decode_on_the_gpu_gives_the_uncompiled_tokens(tiny_model_dir: Path) -> None:
    plain = LLM(str(tiny_model_dir), dtype="float32", num_blocks=128)  # not compiled
    # No warm-up: only the graphs these steps use are compiled (each costs tens of seconds).
    compiled = LLM(
        str(tiny_model_dir), dtype="float32", num_blocks=128, compile=True, compile_warmup=False
    )
    assert greedy(compiled, PROMPTS) == greedy(plain, PROMPTS)
    assert compiled.engine.runner._compiled_buckets  # graphs ran (a failed compile runs eagerly)


def test_decode_steps_replay_cuda_graphs_with_the_eager_tokens(tiny_model_dir: Path) -> None:
    kw: dict[str, object] = {"dtype": "float32", "block_size": 4, "num_blocks": 256}
    eager = LLM(str(tiny_model_dir), cuda_graphs=False, **kw)
    replayed = LLM(str(tiny_model_dir), max_num_seqs=5, **kw)
    prompts = [*PROMPTS, "One two three", "¿Qué tal? 你好，世界 🌍"]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=0)
    got = replayed.generate(prompts, params, use_tqdm=False)
    ref = eager.generate(prompts, params, use_tqdm=False)
    assert_same_tokens_and_logprobs(got, ref, 1e-3)
    graphs = replayed.engine.runner.graphs
    assert graphs is not None and eager.engine.runner.graphs is None
    # 5 running decodes padded to 8 rows; tables widened as contexts grow: several graphs
    assert any(rows == 8 for rows, _ in graphs.graphs)
    assert len(graphs.graphs) >= 3 and sum(graphs.steps.values()) >= 24


@pytest.fixture(scope="module")
def smollm2_bf16(smollm2_gguf_path: Path) -> LLM:
    return LLM(str(smollm2_gguf_path), num_blocks=256)


def test_the_real_model_answers_in_the_gpus_dtype(smollm2_bf16: LLM) -> None:
    llm = smollm2_bf16
    assert llm.engine.runner.kv_caches[0][0].dtype == llm.engine.precision.dtype
    assert llm.engine.precision.device.type == "cuda"
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    [out] = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0), use_tqdm=False)
    assert "Paris" in out.outputs[0].text


def test_the_default_kv_cache_takes_the_gpus_memory(smollm2_gguf_path: Path) -> None:
    """No budget named: --gpu-memory-utilization's share less the weights, up to what the
    running requests can fill (64 x 8192 tokens x 22.5 KiB of bf16 K/V = 11.25 GiB), not the
    CPU's 2 GiB."""
    free, total = torch.cuda.mem_get_info()
    llm = LLM(str(smollm2_gguf_path), max_num_seqs=64)
    pool = sum(k.numel() * k.element_size() * 2 for k, _ in llm.engine.runner.kv_caches)
    fill = 64 * 8192 * 23040
    assert min(fill, 0.9 * total - (total - free) - (2 << 30)) < pool <= fill + (32 << 20)
    [out] = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8), use_tqdm=False)
    assert out.outputs[0].token_ids
