"""Where precision, quantization and the KV cache are decided from the configs and the device:
`load_model` builds what the engine runs (and logs why), `capability_report` says the same
without reading the weights (`surge info`). Both start from one `plan_load`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

import psutil
import torch
from torch import Tensor

from surge.engine.config import CacheConfig, ModelConfig, SchedulerConfig
from surge.engine.runner import huge_pages
from surge.engine.runner.kv_cache import (
    AVERAGE_CONTEXT_TOKENS,
    CPU_KV_CACHE_GIB,
    MAX_RECOMMENDED_SEQS,
    KVCachePlan,
    allocate_kv_cache,
    gpu_kv_budget_bytes,
    kv_bytes_per_token,
    plan_kv_cache,
    recommend_max_num_seqs,
    step_transient_bytes,
)
from surge.models.build import build_model
from surge.models.device import (
    DTYPE_NAMES,
    Precision,
    choose_kv_dtype,
    choose_precision,
    cpu_flags,
    describe,
)
from surge.models.formats.model_files import ModelFiles
from surge.models.formats.spec import ModelSpec
from surge.models.llama import LlamaForCausalLM
from surge.models.quant import estimate_weight_bytes, weight_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What the configs and the device decide, before any weight is read."""

    model_cfg: ModelConfig  # as given, with `quantization` resolved where it was "auto"
    quantization_reason: str
    precision: Precision
    kv_dtype: torch.dtype
    kv_reason: str
    kv_budget_gib: float  # the KV cache's memory budget (unused where num_blocks is set)
    kv_budget_reason: str
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


GIB = 1 << 30


def kv_budget(
    model_cfg: ModelConfig,
    cache_cfg: CacheConfig,
    sched_cfg: SchedulerConfig,
    spec: ModelSpec,
    precision: Precision,
    kv_dtype: torch.dtype,
    max_len: int,
) -> tuple[float, str]:
    """The KV cache's memory budget in GiB, and why: as named, a CPU's default, or on a GPU
    what --gpu-memory-utilization leaves after the weights (estimated from the spec, as the
    plan is made before they load) and a step's transients, up to what max_num_seqs requests
    of max_len tokens can fill. `model_cfg.quantization` is resolved (not "auto")."""
    if cache_cfg.kv_cache_memory_gib is not None:
        return cache_cfg.kv_cache_memory_gib, "--kv-cache-memory-gib"
    if precision.device.type != "cuda":
        return CPU_KV_CACHE_GIB, f"the default on a {precision.device.type}"
    free, total = torch.cuda.mem_get_info(precision.device)
    # Blocks torch's allocator holds for this process but no tensor uses (an engine dropped
    # earlier) are ours to reuse, though the driver counts them as taken.
    free += torch.cuda.memory_reserved(precision.device) - torch.cuda.memory_allocated(
        precision.device
    )
    util = cache_cfg.gpu_memory_utilization
    weights = estimate_weight_bytes(spec, precision.dtype, model_cfg.quantization)
    transient = step_transient_bytes(spec, sched_cfg.max_num_batched_tokens, sched_cfg.max_num_seqs)
    budget = gpu_kv_budget_bytes(total, free, weights, transient, util)
    what = (
        f"{util:.0%} of {total / GIB:.1f} GiB (free {free / GIB:.1f}), less weights "
        f"{weights / GIB:.2f} and a step's transients {transient / GIB:.2f}"
    )
    if budget <= 0:
        raise ValueError(
            f"no GPU memory left for the KV cache: {what}; raise --gpu-memory-utilization, "
            "free the GPU, or name a budget with --kv-cache-memory-gib"
        )
    # No more than every running request at the full context can fill: past that a small
    # model on a large GPU would take its memory (and millions of block entries) for nothing.
    fill = sched_cfg.max_num_seqs * max_len * kv_bytes_per_token(spec, kv_dtype)
    if fill < budget:
        return fill / GIB, f"{sched_cfg.max_num_seqs} requests x {max_len} tokens ({what})"
    return budget / GIB, what


def q4_kernel_name() -> str | None:
    """The vectorized 4-bit kernel this CPU's flags allow (q4_gemv.h), or None."""
    flags = cpu_flags()
    if "avx512_vnni" in flags:
        return "AVX-512 VNNI"
    if {"avx2", "fma", "f16c"} <= flags:
        return "AVX2"
    return None


def resolve_quantization(
    model_cfg: ModelConfig, precision: Precision, layer_format: str | None
) -> tuple[str, str]:
    """The quantization to run, and why. "auto" runs a Q4_1 GGUF's own 4-bit blocks (q4: the
    file's weights as stored, activations rounded per block of 32 as llama.cpp does) on a CPU
    whose 4-bit kernel builds, where they decode 2-10x faster than the same weights as floats
    (BENCHMARKS.md, seventh and eleventh passes). A GGUF in other blocks (mixed K-quants as
    most GGUFs are, Q8_0...) runs int8 on a CPU: its weights were rounded already, and 8 bits
    keep them (Gemma 3 270M Q4_K_M: perplexity -0.9% against float32, decode ~3x faster;
    requantized to 4 bits +25%). Anything else runs unquantized (no 4-bit GPU kernel, int8 slower
    than bf16 on a GPU; a float file is not rounded unasked)."""
    if model_cfg.quantization != "auto":
        return model_cfg.quantization, "--quantization"
    quantized_file = layer_format is not None and layer_format.startswith(("Q", "IQ", "mixed"))
    on_cpu = precision.device.type == "cpu" and model_cfg.use_kernels
    if layer_format != "Q4_1" and quantized_file and on_cpu:
        stored = f"in {layer_format} blocks" if layer_format != "mixed" else "in mixed K-quants"
        return "int8", f"auto: the layers are stored {stored}; int8 keeps them on this CPU"
    if layer_format != "Q4_1":
        return "none", f"auto: the layers are stored {layer_format or 'as floats or mixed'}"
    if precision.device.type != "cpu":
        return "none", "auto: no 4-bit kernel on this device"
    kernel = q4_kernel_name() if model_cfg.use_kernels else None
    if kernel is None:
        return "none", "auto: no vectorized 4-bit kernel here"
    from surge.models.kernels import load_q4_linear

    if load_q4_linear() is None:
        return "none", "auto: the 4-bit kernel did not build here"
    return "q4", f"auto: the file's own Q4_1 blocks on the {kernel} kernel"


def plan_load(
    model_cfg: ModelConfig,
    cache_cfg: CacheConfig,
    spec: ModelSpec,
    sched_cfg: SchedulerConfig | None = None,
    layer_format: str | None = None,
) -> LoadPlan:
    precision = choose_precision(model_cfg.device, model_cfg.dtype)
    quantization, quantization_reason = resolve_quantization(model_cfg, precision, layer_format)
    model_cfg = replace(model_cfg, quantization=quantization)
    kv_dtype, kv_reason = choose_kv_dtype(cache_cfg.kv_cache_dtype, precision)
    max_len = model_cfg.max_model_len or spec.max_position_embeddings
    if cache_cfg.num_blocks is None:
        sched = sched_cfg or SchedulerConfig()
        budget, budget_reason = kv_budget(
            model_cfg, cache_cfg, sched, spec, precision, kv_dtype, max_len
        )
    else:
        budget, budget_reason = 0.0, "--num-kv-blocks"
    kv_plan = plan_kv_cache(spec, kv_dtype, cache_cfg.block_size, budget, cache_cfg.num_blocks)
    return LoadPlan(
        model_cfg,
        quantization_reason,
        precision,
        kv_dtype,
        kv_reason,
        budget,
        budget_reason,
        kv_plan,
        max_len,
        min(max_len, kv_plan.num_tokens),
    )


def quantization_hint(model_cfg: ModelConfig, precision: Precision) -> str | None:
    """A faster setting for this device: on a CPU with a vectorized 4-bit kernel (and the
    kernels on) when the weights run unquantized, since a CPU decode step reads every weight, so
    bytes per weight set its speed (float32 on AVX2 decoded ~10x slower than q4 in BENCHMARKS.md's
    seventh pass); on a GPU when they are quantized, since Surge has no GPU kernel for 4-bit
    weights and its int8 paths measured slower than bf16 there (tenth pass). `model_cfg` comes
    from the plan, its quantization resolved."""
    if precision.device.type == "cuda" and model_cfg.quantization != "none":
        return (
            f"--quantization {model_cfg.quantization} saves GPU memory but not time: there is no "
            "4-bit GPU kernel (q4 runs its int8 copy), and int8 decoded slower than bf16 on an "
            "H200 (1 request 217 against 272 tok/s, 64 requests 5,790 against 12,543)"
        )
    if (
        model_cfg.quantization != "none"
        or not model_cfg.use_kernels
        or precision.device.type != "cpu"
    ):
        return None
    kernel = q4_kernel_name()
    if kernel is None:
        return None
    return (
        f"decode is faster with --quantization q4 (4-bit weights, {kernel} kernel here; a Q4_1 "
        f"GGUF's own blocks) or int8: 2-10x float at one request on the CPUs in BENCHMARKS.md"
    )


def load_memory_refusal(
    spec: ModelSpec, dtype: torch.dtype, quantization: str, available: int
) -> str | None:
    """Why this model cannot be loaded in `available` bytes, in one line; None if it can.

    The network is built in float32 from the file's dequantized tensors and then quantized, so
    the peak is the float32 model plus its final form; refusing before that peak beats being
    killed by the kernel's OOM killer halfway through (an 8B's float32 copy alone is 32 GB)."""
    float32 = estimate_weight_bytes(spec, torch.float32, "none")
    final = (
        0
        if quantization == "none" and dtype == torch.float32
        else estimate_weight_bytes(spec, dtype, quantization)
    )
    need = float32 + final
    if need <= available:
        return None
    return (
        f"not enough memory to load this model: it needs {need / GIB:.1f} GiB while loading "
        f"(its {float32 / GIB:.1f} GiB float32 copy, then {final / GIB:.1f} GiB "
        f"{quantization if quantization != 'none' else DTYPE_NAMES.get(dtype, str(dtype))}), "
        f"and {available / GIB:.1f} GiB is available"
    )


def load_model(
    model_cfg: ModelConfig,
    cache_cfg: CacheConfig,
    files: ModelFiles,
    sched_cfg: SchedulerConfig | None = None,
) -> LoadedModel:
    """Build and quantize the model, allocate the KV cache, and log what was chosen and why."""
    spec = files.spec
    p = plan_load(model_cfg, cache_cfg, spec, sched_cfg, files.layer_format)
    precision, kv_plan, model_cfg = p.precision, p.kv_plan, p.model_cfg
    if precision.device.type == "cpu":
        refusal = load_memory_refusal(
            spec, precision.dtype, model_cfg.quantization, psutil.virtual_memory().available
        )
        if refusal:
            raise MemoryError(refusal)
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
        "model %s: %s (%s); quantization %s (%s); weights %.1f MiB, loaded in %.1f s",
        files.path.name,
        DTYPE_NAMES.get(precision.dtype, str(precision.dtype)),
        precision.reason,
        model_cfg.quantization,
        p.quantization_reason,
        weight_bytes(model) / (1 << 20),
        time.perf_counter() - t0,
    )
    hint = quantization_hint(model_cfg, precision)
    if hint:
        log.info("hint: %s", hint)
    log.info(
        "KV cache %s (%s): %d blocks x %d tokens = %d tokens (%.2f GiB: %s); context %d",
        DTYPE_NAMES.get(p.kv_dtype, str(p.kv_dtype)),
        p.kv_reason,
        kv_plan.num_blocks,
        kv_plan.block_size,
        kv_plan.num_tokens,
        kv_plan.total_bytes / GIB,
        p.kv_budget_reason,
        p.max_model_len,
    )
    kv_caches = allocate_kv_cache(spec, kv_plan, p.kv_dtype, precision.device)
    if precision.device.type == "cpu":
        available = psutil.virtual_memory().available
        if kv_plan.total_bytes > available:  # taken as it fills (huge_pages.py): warn now
            log.warning(
                "the KV cache (%.2f GiB) is more than the memory available now (%.2f GiB): it "
                "is taken as it fills, so a full cache may exhaust memory; --kv-cache-memory-gib "
                "sets it",
                kv_plan.total_bytes / GIB,
                available / GIB,
            )
        elif huge_pages.prefault_in_background([t for pair in kv_caches for t in pair]):
            # Its pages built while idle, not by the steps that first write them (huge_pages.py).
            log.info("KV cache: building its pages in the background, at idle priority")
    return LoadedModel(
        model=model,
        precision=precision,
        plan=kv_plan,
        kv_caches=kv_caches,
        max_model_len=p.max_model_len,
    )


def capability_report(
    model_cfg: ModelConfig,
    cache_cfg: CacheConfig,
    files: ModelFiles,
    sched_cfg: SchedulerConfig | None = None,
) -> str:
    """What `load_model` would choose here, and what it buys, without reading the weights."""
    spec = files.spec
    p = plan_load(model_cfg, cache_cfg, spec, sched_cfg, files.layer_format)
    precision, plan, max_len, model_cfg = p.precision, p.kv_plan, p.max_model_len, p.model_cfg
    dtype = precision.dtype
    mib = 1 << 20

    def weights(dt: torch.dtype, quantization: str = "none") -> str:
        return f"{estimate_weight_bytes(spec, dt, quantization) / mib:.1f} MiB"

    caps = precision.caps
    per_token = plan.bytes_per_block // plan.block_size
    lines = [
        f"device        {describe(caps) if caps else precision.device}",
        f"dtype         {DTYPE_NAMES[dtype]} ({precision.reason})",
        f"quantization  {model_cfg.quantization} ({p.quantization_reason})",
        f"model         {files.path.name}: {spec.architecture}, {spec.num_layers} layers, "
        f"hidden {spec.hidden_size}, vocab {spec.vocab_size}",
        f"weights       {weights(dtype, model_cfg.quantization)} "
        f"(float32 {weights(torch.float32)}, bfloat16 {weights(torch.bfloat16)}, "
        f"int8 {weights(dtype, 'int8')}, q4 {weights(dtype, 'q4')})",
        f"KV cache      {DTYPE_NAMES[p.kv_dtype]} ({p.kv_reason}), "
        f"{per_token / 1024:.1f} KiB/token",
        f"KV capacity   {plan.total_bytes / GIB:.2f} GiB -> {plan.num_tokens:,} tokens "
        f"({plan.num_blocks:,} blocks of {plan.block_size}); context {max_len:,}",
        f"KV budget     {p.kv_budget_reason}",
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
    named = {round(p.kv_budget_gib, 1)} if p.kv_budget_gib >= 0.1 else set()
    budgets = sorted({0.5, 1.0, 2.0, 4.0, 8.0, *named})
    for gib in budgets:
        tokens = int(gib * GIB) // plan.bytes_per_block * plan.block_size
        rec = recommend_max_num_seqs(tokens, max_len)
        lines.append(
            f"{gib:>6.1f} GiB {tokens:>10,} {tokens // 512:>9,} {tokens // 2048:>10,} {rec:>13}"
        )
    return "\n".join(lines)
