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
    CPU_KV_FREE_SHARE,
    MAX_RECOMMENDED_SEQS,
    KVCachePlan,
    allocate_kv_cache,
    cpu_kv_budget_bytes,
    gpu_kv_budget_bytes,
    kv_bytes_per_token,
    plan_kv_cache,
    recommend_max_num_seqs,
    step_transient_bytes,
)
from surge.engine.runner.load_memory import (
    describe_forms,
    load_memory_refusal,
    load_peak_bytes,
    versus_file,
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
from surge.models.forms import (
    DEFAULT_FORM,
    FORM_BY_TYPE,
    estimate_forms,
    estimate_weight_bytes,
    resident_by_form,
)
from surge.models.layout_cache import layout_cache
from surge.models.llama import LlamaForCausalLM
from surge.models.quant import cpu_int8_fast, weight_bytes
from surge.models.stream_load import with_progress

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
    kinds: dict[str, str] | None = None,
) -> tuple[float, str]:
    """The KV cache's memory budget in GiB, and why: as named, a CPU's default, or on a GPU
    what --gpu-memory-utilization leaves after the weights (estimated from the spec, as the
    plan is made before they load) and a step's transients, up to what max_num_seqs requests
    of max_len tokens can fill. `model_cfg.quantization` is resolved (not "auto")."""
    if cache_cfg.kv_cache_memory_gib is not None:
        return cache_cfg.kv_cache_memory_gib, "--kv-cache-memory-gib"
    if precision.device.type == "cpu":
        available = psutil.virtual_memory().available
        weights = estimate_weight_bytes(spec, precision.dtype, model_cfg.quantization, kinds)
        budget = cpu_kv_budget_bytes(available, weights)
        if budget >= CPU_KV_CACHE_GIB * GIB:
            return CPU_KV_CACHE_GIB, "the default on a cpu"
        return budget / GIB, (
            f"{CPU_KV_FREE_SHARE:.0%} of the {(available - weights) / GIB:.1f} GiB available "
            f"after the weights ({available / GIB:.1f} GiB available, weights "
            f"{weights / GIB:.2f}); the default {CPU_KV_CACHE_GIB:.1f} GiB does not fit"
        )
    if precision.device.type != "cuda":
        return CPU_KV_CACHE_GIB, f"the default on a {precision.device.type}"
    free, total = torch.cuda.mem_get_info(precision.device)
    # Blocks torch's allocator holds for this process but no tensor uses (an engine dropped
    # earlier) are ours to reuse, though the driver counts them as taken.
    free += torch.cuda.memory_reserved(precision.device) - torch.cuda.memory_allocated(
        precision.device
    )
    util = cache_cfg.gpu_memory_utilization
    weights = estimate_weight_bytes(spec, precision.dtype, model_cfg.quantization, kinds)
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
    """The quantization to run, and why. "auto" on a CPU with the kernels keeps a quantized
    GGUF's matrices in the forms their GGML types map to (forms.FORM_BY_TYPE): Q4_0/Q4_1
    blocks as the 4-bit layout they map into bit for bit (q4: activations rounded per block of
    32 as llama.cpp does; 2-10x faster decode than the same weights as floats, BENCHMARKS.md
    seventh and eleventh passes), K-quants on their own blocks (GGUFLinear: the file's bytes,
    int8 activations per block of 32), Q8_0 as int8 (8 bits keep it; a row lookup for the
    embedding). A file whose layers all map to one
    form runs as that quantization ("q4", "int8"), a mixed one as "gguf" (each by its type).
    Anything else runs unquantized (no 4-bit GPU kernel, int8 slower than bf16 on a GPU; a float
    file is not rounded unasked)."""
    if model_cfg.quantization != "auto":
        return model_cfg.quantization, "--quantization"
    quantized_file = layer_format is not None and layer_format.startswith(("Q", "IQ", "mixed"))
    if not quantized_file:
        return "none", f"auto: the layers are stored {layer_format or 'as floats or mixed'}"
    assert layer_format is not None
    if precision.device.type != "cpu" or not model_cfg.use_kernels:
        where = "this device" if precision.device.type != "cpu" else "torch ops (--no-kernels)"
        return "none", f"auto: no kernel for {layer_format} blocks on {where}"
    form = FORM_BY_TYPE.get(layer_format, DEFAULT_FORM) if layer_format != "mixed" else "mixed"
    if form in ("q4", "mixed"):
        kernel = q4_kernel_name()
        from surge.models.kernels import load_q4_linear

        if kernel is None or load_q4_linear() is None:
            why = "no vectorized 4-bit kernel here" if kernel is None else "it did not build"
            return "int8", f"auto: {layer_format} blocks as int8 ({why})"
        if form == "q4":
            return "q4", f"auto: the file's own {layer_format} blocks on the {kernel} kernel"
        return "gguf", (
            "auto: the layers are stored in mixed types; each matrix in its type's form "
            f"(Q4_0/Q4_1 blocks 4-bit on the {kernel} kernel, K-quants on their own blocks, "
            "Q8_0 int8; a fused matrix of mixed types as segments on their own blocks)"
        )
    stored = f"in {layer_format} blocks"
    if form == "int8":
        return "int8", f"auto: the layers are stored {stored}; int8 keeps them on this CPU"
    return "gguf", f"auto: the layers are stored {stored}; run as {form} (forms.FORM_BY_TYPE)"


# The most bytes an int8 copy of the 4-bit layers may add under auto (q4-int8): a small model's
# copy (SmolLM2-135M's ~100 MiB) is worth its memory on a CPU with int8 dot products, where a
# batch of 64 rows runs ~1.6x faster on it; a 1-8B model's is not (the file's size is the bound).
SMALL_COPY_BYTES = 512 << 20


def _small_model_batch_copy(
    spec: ModelSpec, precision: Precision, kinds: dict[str, str] | None, reason: str
) -> tuple[str, str]:
    """q4 resolved by auto: q4-int8 instead where the CPU has VNNI/AMX and the copy is small."""
    if not cpu_int8_fast():
        return "q4", reason
    extra = estimate_weight_bytes(spec, precision.dtype, "q4-int8", kinds)
    extra -= estimate_weight_bytes(spec, precision.dtype, "q4", kinds)
    if extra > SMALL_COPY_BYTES:
        return "q4", f"{reason} (no int8 copy for batches: it would add {extra >> 20} MiB)"
    return "q4-int8", f"{reason}, with an int8 copy for large batches ({extra >> 20} MiB, VNNI)"


def plan_load(
    model_cfg: ModelConfig,
    cache_cfg: CacheConfig,
    spec: ModelSpec,
    sched_cfg: SchedulerConfig | None = None,
    layer_format: str | None = None,
    kinds: dict[str, str] | None = None,
) -> LoadPlan:
    precision = choose_precision(model_cfg.device, model_cfg.dtype)
    quantization, quantization_reason = resolve_quantization(model_cfg, precision, layer_format)
    if quantization == "q4" and model_cfg.quantization == "auto":
        quantization, quantization_reason = _small_model_batch_copy(
            spec, precision, kinds, quantization_reason
        )
    model_cfg = replace(model_cfg, quantization=quantization)
    kv_dtype, kv_reason = choose_kv_dtype(cache_cfg.kv_cache_dtype, precision)
    max_len = model_cfg.max_model_len or spec.max_position_embeddings
    if cache_cfg.num_blocks is None:
        sched = sched_cfg or SchedulerConfig()
        budget, budget_reason = kv_budget(
            model_cfg, cache_cfg, sched, spec, precision, kv_dtype, max_len, kinds
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


def load_model(
    model_cfg: ModelConfig,
    cache_cfg: CacheConfig,
    files: ModelFiles,
    sched_cfg: SchedulerConfig | None = None,
) -> LoadedModel:
    """Build and quantize the model, allocate the KV cache, and log what was chosen and why."""
    spec = files.spec
    kinds = files.matrix_kinds()
    p = plan_load(model_cfg, cache_cfg, spec, sched_cfg, files.layer_format, kinds)
    precision, kv_plan, model_cfg = p.precision, p.kv_plan, p.model_cfg
    if precision.device.type == "cpu":
        available = psutil.virtual_memory().available
        refusal = load_memory_refusal(
            spec, precision.dtype, model_cfg.quantization, available, kinds
        )
        if refusal:
            raise MemoryError(refusal)
    t0 = time.perf_counter()
    model = build_model(
        spec,
        with_progress(files.sources(), files.tensor_bytes),
        precision.device,
        precision.dtype,
        max(p.max_position, spec.max_position_embeddings),
        quantization=model_cfg.quantization,
        use_kernels=model_cfg.use_kernels,
        layout=layout_cache(
            files.path,
            model_cfg.quantization,
            precision.dtype,
            precision.device,
            model_cfg.use_kernels,
        ),
    )
    if precision.caps is not None:
        log.info("device %s", describe(precision.caps))
    total = weight_bytes(model)
    log.info(
        "model %s: %s (%s); quantization %s (%s); weights %.1f MiB (%s; %s), loaded in %.1f s",
        files.path.name,
        DTYPE_NAMES.get(precision.dtype, str(precision.dtype)),
        precision.reason,
        model_cfg.quantization,
        p.quantization_reason,
        total / (1 << 20),
        describe_forms(resident_by_form(model)),
        versus_file(total, files.tensor_bytes) or "no file size",
        time.perf_counter() - t0,
    )
    hint = quantization_hint(model_cfg, precision)
    if hint:
        log.info("hint: %s", hint)
    log.info(
        "KV cache %s (%s), %.1f KiB a token: %d blocks x %d tokens = %d tokens (%.2f GiB: %s); "
        "context %d; max_num_seqs %d (recommended for this cache: %d)",
        DTYPE_NAMES.get(p.kv_dtype, str(p.kv_dtype)),
        p.kv_reason,
        kv_plan.bytes_per_block / kv_plan.block_size / 1024,
        kv_plan.num_blocks,
        kv_plan.block_size,
        kv_plan.num_tokens,
        kv_plan.total_bytes / GIB,
        p.kv_budget_reason,
        p.max_model_len,
        (sched_cfg or SchedulerConfig()).max_num_seqs,
        recommend_max_num_seqs(kv_plan.num_tokens, p.max_model_len),
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
    kinds = files.matrix_kinds()
    p = plan_load(model_cfg, cache_cfg, spec, sched_cfg, files.layer_format, kinds)
    precision, plan, max_len, model_cfg = p.precision, p.kv_plan, p.max_model_len, p.model_cfg
    dtype = precision.dtype
    mib = 1 << 20

    def weights(dt: torch.dtype, quantization: str = "none") -> str:
        return f"{estimate_weight_bytes(spec, dt, quantization, kinds) / mib:.1f} MiB"

    by_form = estimate_forms(spec, dtype, model_cfg.quantization, kinds)
    total, tensor_bytes = sum(by_form.values()), files.tensor_bytes
    _, peak = load_peak_bytes(spec, dtype, model_cfg.quantization, kinds)
    available = psutil.virtual_memory().available
    stored = files.layer_format or ("floats" if kinds is None else "mixed floats")

    caps = precision.caps
    per_token = plan.bytes_per_block // plan.block_size
    lines = [
        f"device        {describe(caps) if caps else precision.device}",
        f"dtype         {DTYPE_NAMES[dtype]} ({precision.reason})",
        f"quantization  {model_cfg.quantization} ({p.quantization_reason})",
        f"model         {files.path.name}: {spec.architecture}, {spec.num_layers} layers, "
        f"hidden {spec.hidden_size}, vocab {spec.vocab_size}",
        f"file          {tensor_bytes / mib:.1f} MiB of tensors (layers {stored})",
        f"weights       {total / mib:.1f} MiB once loaded ({describe_forms(by_form)}"
        + (f"; {versus_file(total, tensor_bytes)})" if tensor_bytes else ")"),
        f"as others     float32 {weights(torch.float32)}, bfloat16 {weights(torch.bfloat16)}, "
        f"int8 {weights(dtype, 'int8')}, q4 {weights(dtype, 'q4')}, "
        f"q4-int8 {weights(dtype, 'q4-int8')}",
        f"load peak     {peak / GIB:.2f} GiB (the weights and the largest tensor in flight); "
        f"{available / GIB:.1f} GiB available now",
        f"KV cache      {DTYPE_NAMES[p.kv_dtype]} ({p.kv_reason}), "
        f"{per_token / 1024:.1f} KiB/token",
        f"KV capacity   {plan.total_bytes / GIB:.2f} GiB -> {plan.num_tokens:,} tokens "
        f"({plan.num_blocks:,} blocks of {plan.block_size}); context {max_len:,}",
        f"KV budget     {p.kv_budget_reason}",
        f"max_num_seqs  recommended {recommend_max_num_seqs(plan.num_tokens, max_len)} "
        f"(KV tokens / {AVERAGE_CONTEXT_TOKENS}-token average context, at most "
        f"{MAX_RECOMMENDED_SEQS}); configured {(sched_cfg or SchedulerConfig()).max_num_seqs}",
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
