"""Device and precision chosen from what the hardware can do, with the reason (logged at start).

CPU capabilities are the instruction sets the kernel declares in /proc/cpuinfo; CUDA's are the
compute capability. What each one decides:

    bf16 matmuls   CPU: AVX512_BF16 or AMX_BF16          CUDA: sm80+ (else fp16)
    fp16 matmuls   CPU: AVX512_FP16 or AMX_FP16          CUDA: always
    int8 GEMM      CPU: AVX512_VNNI, AVX_VNNI or AMX_INT8 CUDA: sm75+ (IMMA via torch._int_mm)
    fp8            CUDA sm89+: reported only, no fp8 path yet
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {**{v: k for k, v in DTYPES.items()}, torch.int8: "int8"}  # int8: KV caches only


@dataclass(frozen=True, slots=True)
class DeviceCaps:
    device: torch.device
    name: str  # CPU model and threads, or GPU name and compute capability
    features: tuple[str, ...]  # the flags that decided anything below
    dtypes: tuple[str, ...]  # dtypes with native matmuls here, fastest first
    int8: bool  # native int8 dot products (int8 GEMMs ~2x bf16)
    fp8: bool
    memory_bytes: int  # RAM or GPU memory, total


@dataclass(frozen=True, slots=True)
class Precision:
    device: torch.device
    dtype: torch.dtype
    reason: str
    caps: DeviceCaps | None = None
    requested: bool = False  # the dtype was named (--dtype), not chosen for the device


def choose_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(name)


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):  # x86, aarch64
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or "CPU"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def device_caps(device: torch.device, flags: set[str] | None = None) -> DeviceCaps:
    """What `device` does natively. `flags` overrides /proc/cpuinfo (tests)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        props = torch.cuda.get_device_properties(device)
        sm = major * 10 + minor
        return DeviceCaps(
            device,
            f"{props.name} (sm{sm})",
            (f"sm{sm}",),
            ("bfloat16", "float16", "float32") if sm >= 80 else ("float16", "float32"),
            int8=sm >= 75,
            fp8=sm >= 89,
            memory_bytes=int(props.total_memory),
        )
    flags = cpu_flags() if flags is None else flags
    names = {
        "avx2": "AVX2",
        "avx512f": "AVX512F",
        "avx512_bf16": "AVX512_BF16",
        "avx512_fp16": "AVX512_FP16",
        "avx512_vnni": "AVX512_VNNI",
        "avx_vnni": "AVX_VNNI",
        "amx_bf16": "AMX_BF16",
        "amx_fp16": "AMX_FP16",
        "amx_int8": "AMX_INT8",
    }
    features = tuple(label for flag, label in names.items() if flag in flags)
    native: list[str] = []
    if flags & {"avx512_bf16", "amx_bf16"}:
        native.append("bfloat16")
    if flags & {"avx512_fp16", "amx_fp16"}:
        native.append("float16")
    native.append("float32")
    return DeviceCaps(
        device,
        f"{cpu_name()}, {torch.get_num_threads()} threads",
        features,
        tuple(native),
        int8=bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"}),
        fp8=False,
        memory_bytes=_ram_bytes(),
    )


def choose_precision(
    device_name: str = "auto", dtype_name: str = "auto", caps: DeviceCaps | None = None
) -> Precision:
    device = choose_device(device_name)
    caps = caps or device_caps(device)
    if dtype_name != "auto":
        native = "" if dtype_name in caps.dtypes else " (not native here: emulated, slow)"
        return Precision(
            device, DTYPES[dtype_name], f"{dtype_name} requested{native}", caps, requested=True
        )
    if device.type == "cuda":
        sm = caps.features[0]
        if "bfloat16" in caps.dtypes:
            return Precision(device, torch.bfloat16, f"CUDA {sm} supports bf16", caps)
        return Precision(device, torch.float16, f"CUDA {sm}: fp16 (bf16 needs sm80)", caps)
    if "bfloat16" in caps.dtypes:
        has = "/".join(f for f in caps.features if f in ("AVX512_BF16", "AMX_BF16"))
        return Precision(device, torch.bfloat16, f"CPU has {has}: bf16 matmuls", caps)
    return Precision(device, torch.float32, "CPU without native bf16: float32", caps)


def choose_kv_dtype(name: str, precision: Precision) -> tuple[torch.dtype, str]:
    """The KV cache dtype and why. `auto` follows the model's dtype, except where `auto` chose
    float32 on a CPU for want of native bf16: there the cache is bf16 (llama.cpp's cache is f16
    whatever the weights). Decode attention reads the whole cache every step, so half the bytes
    is a faster step at many requests and twice the tokens per GiB; the kernels widen bf16 to
    float32 exactly, and against a float32 cache it measured perplexity -0.01% and
    teacher-forced agreement 99.7% on SmolLM2 (BENCHMARKS.md). A named --dtype float32 keeps a
    float32 cache."""
    if name == "auto":
        if (
            precision.device.type == "cpu"
            and precision.dtype == torch.float32
            and not precision.requested
        ):
            return torch.bfloat16, (
                "bf16 with float32 weights on a CPU without native bf16: half the bytes per "
                "token; --kv-cache-dtype float32 to match the weights"
            )
        return precision.dtype, "follows the model dtype"
    if name == "int8":
        return torch.int8, "requested: int8 rows with a scale per token and head"
    if name not in DTYPES:
        raise ValueError(f"kv cache dtype must be auto|{'|'.join(DTYPES)}|int8, got {name!r}")
    return DTYPES[name], "requested"


def describe(caps: DeviceCaps) -> str:
    """One line: device, features, native dtypes, int8/fp8 and memory."""
    feats = ", ".join(caps.features) or "no vector extensions detected"
    extras = [x for x, ok in (("int8", caps.int8), ("fp8", caps.fp8)) if ok]
    native = ", ".join([*caps.dtypes, *extras])
    mem = f"{caps.memory_bytes / (1 << 30):.1f} GiB"
    return f"{caps.device.type}: {caps.name} [{feats}]; native: {native}; memory {mem}"
