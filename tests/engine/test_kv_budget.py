"""The KV cache's memory budget: named, a CPU's default, or on a GPU what
--gpu-memory-utilization leaves after the weights and a step's transients (vLLM's rule)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from surge.cli.main import main as cli_main
from surge.engine.config import CacheConfig, ModelConfig, SchedulerConfig
from surge.engine.runner.kv_cache import (
    CPU_KV_CACHE_GIB,
    GPU_FIXED_RESERVE_BYTES,
    gpu_kv_budget_bytes,
    kv_bytes_per_token,
    step_transient_bytes,
)
from surge.engine.runner.loader import kv_budget, load_memory_refusal, plan_load
from surge.models.device import Precision
from surge.models.formats.model_files import open_model
from surge.models.forms import estimate_weight_bytes

GIB = 1 << 30


def test_gpu_budget_is_the_utilized_share_less_weights_and_transients() -> None:
    # An idle 140 GiB GPU: 90% of it, less 0.3 GiB of weights and 0.7 of transients.
    w, t = int(0.3 * GIB), int(0.7 * GIB)
    assert gpu_kv_budget_bytes(140 * GIB, 139 * GIB, w, t, 0.9) == int(0.9 * 140 * GIB) - w - t
    # Another process holds 100 GiB: only what is free now is ours.
    assert gpu_kv_budget_bytes(140 * GIB, 40 * GIB, w, t, 0.9) == 40 * GIB - w - t
    # Weights larger than the share leave nothing.
    assert gpu_kv_budget_bytes(16 * GIB, 16 * GIB, 15 * GIB, t, 0.9) <= 0


def test_step_transients_grow_with_the_step(smollm2_gguf_path: Path) -> None:
    spec = open_model(smollm2_gguf_path).spec
    small, big = step_transient_bytes(spec, 512, 256), step_transient_bytes(spec, 8192, 1024)
    assert GPU_FIXED_RESERVE_BYTES < small < big
    # The float32 logits of 256 rows and the sampler's copies are counted.
    assert small - GPU_FIXED_RESERVE_BYTES >= 4 * 256 * spec.vocab_size


def test_cpu_default_and_a_named_budget(smollm2_gguf_path: Path) -> None:
    spec = open_model(smollm2_gguf_path).spec
    cpu = plan_load(ModelConfig(device="cpu"), CacheConfig(), spec)
    assert (cpu.kv_budget_gib, cpu.kv_budget_reason) == (CPU_KV_CACHE_GIB, "the default on a cpu")
    assert cpu.kv_plan.total_bytes <= CPU_KV_CACHE_GIB * GIB < cpu.kv_plan.total_bytes + GIB / 8
    named = plan_load(ModelConfig(device="cpu"), CacheConfig(kv_cache_memory_gib=0.5), spec)
    assert (named.kv_budget_gib, named.kv_budget_reason) == (0.5, "--kv-cache-memory-gib")
    blocks = plan_load(ModelConfig(device="cpu"), CacheConfig(num_blocks=7), spec)
    assert blocks.kv_plan.num_blocks == 7 and blocks.kv_budget_reason == "--num-kv-blocks"


def test_gpu_budget_reads_the_devices_memory(
    smollm2_gguf_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU branch's arithmetic and message, with the driver's figures fixed (CI has no
    GPU; tests/engine/test_cuda.py checks a real one where there is one)."""
    spec = open_model(smollm2_gguf_path).spec
    gpu = Precision(torch.device("cuda"), torch.bfloat16, "test")
    # As plan_load hands it over: quantization resolved ("auto" is none on a GPU).
    model_cfg, sched = ModelConfig(quantization="none"), SchedulerConfig(max_num_seqs=1024)
    bf16, ctx = torch.bfloat16, 8192  # 1024 x 8192 tokens x 22.5 KiB: more than the GPU
    # Driver: 80 GiB GPU, 70 free; torch's allocator caches 6 GiB of which 2 are in use.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 6 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * GIB)
    weights = estimate_weight_bytes(spec, torch.bfloat16, "none")
    transient = step_transient_bytes(spec, sched.max_num_batched_tokens, 1024)
    gib, why = kv_budget(model_cfg, CacheConfig(), sched, spec, gpu, bf16, ctx)
    assert gib * GIB == pytest.approx(72 * GIB - weights - transient)  # 0.9 x 80 < 70 + 4
    assert "90% of 80.0 GiB" in why
    gib, _ = kv_budget(
        model_cfg, CacheConfig(gpu_memory_utilization=0.5), sched, spec, gpu, bf16, ctx
    )
    assert gib * GIB == pytest.approx(40 * GIB - weights - transient)
    with pytest.raises(ValueError, match="no GPU memory left for the KV cache"):
        kv_budget(model_cfg, CacheConfig(gpu_memory_utilization=0.001), sched, spec, gpu, bf16, ctx)
    # No more than the running requests can fill: 64 x 8192 tokens x 22.5 KiB = 11.25 GiB.
    few = SchedulerConfig(max_num_seqs=64)
    gib, why = kv_budget(model_cfg, CacheConfig(), few, spec, gpu, bf16, ctx)
    assert gib * GIB == 64 * ctx * kv_bytes_per_token(spec, bf16) == 64 * ctx * 23040
    assert why.startswith("64 requests x 8192 tokens")
    # A named budget is used as it is, without asking the driver.
    named = CacheConfig(kv_cache_memory_gib=3.0)
    assert kv_budget(model_cfg, named, sched, spec, gpu, bf16, ctx)[0] == 3.0


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_utilization_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=bad)


def test_info_names_the_budget(smollm2_gguf_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["info", "--model", str(smollm2_gguf_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "KV budget     the default on a cpu" in out
    assert "KV capacity   2.00 GiB" in out


def test_a_model_too_big_to_load_is_refused_in_one_line(smollm2_gguf_path: Path) -> None:
    """Llama-3.1-8B's shapes in 4 GiB: the streamed q4 build needs ~6 GiB (its weights and
    the head's int8 rows in flight), so the load is refused before it starts (the OOM killer
    would end it halfway), naming what it needs; SmolLM2 fits."""
    small = open_model(smollm2_gguf_path).spec
    big = replace(
        small, vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, tie_word_embeddings=False,
    )  # fmt: skip
    why = load_memory_refusal(big, torch.float32, "q4", available=4 * GIB)
    assert why is not None and "\n" not in why
    assert "4.0 GiB is available" in why and "largest tensor in flight" in why
    assert load_memory_refusal(small, torch.float32, "q4", available=4 * GIB) is None
