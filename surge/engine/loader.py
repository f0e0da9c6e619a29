"""Where precision, quantization and the KV cache are decided from the configs and the device:
`load_model` builds what the engine runs (and logs why), `capability_report` says the same
without reading the weights (`surge info`). Both start from one `plan_load`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from surge.engine.config import CacheConfig, ModelConfig
from surge.engine.kv_cache import (
    AVERAGE_CONTEXT_TOKENS,
    MAX_RECOMMENDED_SEQS,
    KVCachePlan,
    allocate_kv_cache,
    plan_kv_cache,
    recommend_max_num_seqs,
)
from surge.models import build_model
from surge.models.device import (
    DTYPE_NAMES,
    Precision,
    choose_kv_dtype,
    choose_precision,
    cpu_flags,
    describe,
)
from surge.models.llama import LlamaForCausalLM
from surge.models.quant import estimate_weight_bytes, weight_bytes
from surge.models.spec import ModelSpec
from surge.models.weights import ModelFiles

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What the configs and the device decide, before any weight is read."""

    precision: Precision
    kv_dtype: torch.dtype
    kv_reason: str
    kv_plan: KVCachePlan
    max_position: int  # the configured context (or the model's): rotary tables cover it
    max_model_len: int  # that context, capped so one request always fits the pool


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """The model on its device with its KV cache, and what was decided to get there."""

    model: LlamaForCausalLM
    precision: Precision
    plan: KVCachePlan
    kv_caches: list[tuple[Tensor, Tensor]]
    max_model_len: int


def plan_load(model_cfg: ModelConfig, cache_cfg: CacheConfig, spec: ModelSpec) -> LoadPlan:
    precision = choose_precision(model_cfg.device, model_cfg.dtype)
    kv_dtype, kv_reason = choose_kv_dtype(cache_cfg.kv_cache_dtype, precision)
    kv_plan = plan_kv_cache(
        spec, kv_dtype, cache_cfg.block_size, cache_cfg.kv_cache_memory_gib, cache_cfg.num_blocks
    )
    max_len = model_cfg.max_model_len or spec.max_position_embeddings
    return LoadPlan(
        precision, kv_dtype, kv_reason, kv_plan, max_len, min(max_len, kv_plan.num_tokens)
    )


def quantization_hint(model_cfg: ModelConfig, precision: Precision) -> str | None:
    """A faster setting for this device when the weights run unquantized on a CPU with a
    vectorized 4-bit kernel (and the kernels on): a CPU decode step reads every weight, so bytes
    per weight set its speed (float32 on AVX2 decoded ~10x slower than q4 in BENCHMARKS.md's
    seventh pass)."""
    if (
        model_cfg.quantization != "none"
        or not model_cfg.use_kernels
        or precision.device.type != "cpu"
    ):
        return None
    flags = cpu_flags()
    if "avx512_vnni" in flags:
        kernel = "AVX-512 VNNI"
    elif {"avx2", "fma", "f16c"} <= flags:
        kernel = "AVX2"
    else:
        return None
    return (
        f"decode is faster with --quantization q4 (4-bit weights, {kernel} kernel here; a Q4_1 "
        f"GGUF's own blocks) or int8: 2-10x float at one request on the CPUs in BENCHMARKS.md"
    )


def load_model(model_cfg: ModelConfig, cache_cfg: CacheConfig, files: ModelFiles) -> LoadedModel:
    """Build and quantize the model, allocate the KV cache, and log what was chosen and why."""
    spec = files.spec
    p = plan_load(model_cfg, cache_cfg, spec)
    precision, kv_plan = p.precision, p.kv_plan
    t0 = time.perf_counter()
    model = build_model(
        spec,
        files.weights(),
        precision.device,
        precision.dtype,
        max(p.max_position, spec.max_position_embeddings),
        quantization=model_cfg.quantization,
        use_kernels=model_cfg.use_kernels,
    )
    if precision.caps is not None:
        log.info("device %s", describe(precision.caps))
    log.info(
        "model %s: %s (%s); quantization %s; weights %.1f MiB, loaded in %.1f s",
        files.path.name,
        DTYPE_NAMES.get(precision.dtype, str(precision.dtype)),
        precision.reason,
        model_cfg.quantization,
        weight_bytes(model) / (1 << 20),
        time.perf_counter() - t0,
    )
    hint = quantization_hint(model_cfg, precision)
    if hint:
        log.info("hint: %s", hint)
    log.info(
        "KV cache %s (%s): %d blocks x %d tokens = %d tokens (%.2f GiB); context %d",
        DTYPE_NAMES.get(p.kv_dtype, str(p.kv_dtype)),
        p.kv_reason,
        kv_plan.num_blocks,
        kv_plan.block_size,
        kv_plan.num_tokens,
        kv_plan.total_bytes / (1 << 30),
        p.max_model_len,
    )
    return LoadedModel(
        model=model,
        precision=precision,
        plan=kv_plan,
        kv_caches=allocate_kv_cache(spec, kv_plan, p.kv_dtype, precision.device),
        max_model_len=p.max_model_len,
    )


def capability_report(model_cfg: ModelConfig, cache_cfg: CacheConfig, files: ModelFiles) -> str:
    """What `load_model` would choose here, and what it buys, without reading the weights."""
    spec = files.spec
    p = plan_load(model_cfg, cache_cfg, spec)
    precision, plan, max_len = p.precision, p.kv_plan, p.max_model_len
    dtype = precision.dtype
    mib = 1 << 20

    def weights(dt: torch.dtype, quantization: str = "none") -> str:
        return f"{estimate_weight_bytes(spec, dt, quantization) / mib:.1f} MiB"

    caps = precision.caps
    per_token = plan.bytes_per_block // plan.block_size
    lines = [
        f"device        {describe(caps) if caps else precision.device}",
        f"dtype         {DTYPE_NAMES[dtype]} ({precision.reason})",
        f"quantization  {model_cfg.quantization}",
        f"model         {files.path.name}: {spec.architecture}, {spec.num_layers} layers, "
        f"hidden {spec.hidden_size}, vocab {spec.vocab_size}",
        f"weights       {weights(dtype, model_cfg.quantization)} "
        f"(float32 {weights(torch.float32)}, bfloat16 {weights(torch.bfloat16)}, "
        f"int8 {weights(dtype, 'int8')}, q4 {weights(dtype, 'q4')})",
        f"KV cache      {DTYPE_NAMES[p.kv_dtype]} ({p.kv_reason}), "
        f"{per_token / 1024:.1f} KiB/token",
        f"KV capacity   {plan.total_bytes / (1 << 30):.2f} GiB -> {plan.num_tokens:,} tokens "
        f"({plan.num_blocks:,} blocks of {plan.block_size}); context {max_len:,}",
        f"max_num_seqs  recommended {recommend_max_num_seqs(plan.num_tokens, max_len)} "
        f"(KV tokens / {AVERAGE_CONTEXT_TOKENS}-token average context, at most "
        f"{MAX_RECOMMENDED_SEQS})",
    ]
    hint = quantization_hint(model_cfg, precision)
    if hint:
        lines.append(f"hint          {hint}")
    lines += [
        "",
        f"{'KV memory':>10} {'tokens':>10} {'seqs@512':>9} {'seqs@2048':>10} {'max_num_seqs':>13}",
    ]
    budgets = sorted({0.5, 1.0, 2.0, 4.0, 8.0, cache_cfg.kv_cache_memory_gib})
    for gib in budgets:
        tokens = int(gib * (1 << 30)) // plan.bytes_per_block * plan.block_size
        rec = recommend_max_num_seqs(tokens, max_len)
        lines.append(
            f"{gib:>6.1f} GiB {tokens:>10,} {tokens // 512:>9,} {tokens // 2048:>10,} {rec:>13}"
        )
    return "\n".join(lines)
