"""Device and precision chosen from what the hardware can do, with the reason (logged at start)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class Precision:
    device: torch.device
    dtype: torch.dtype
    reason: str


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
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def choose_precision(device_name: str = "auto", dtype_name: str = "auto") -> Precision:
    device = choose_device(device_name)
    if dtype_name != "auto":
        return Precision(device, _DTYPES[dtype_name], f"{dtype_name} requested")
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return Precision(device, torch.bfloat16, f"CUDA sm{major}{minor} supports bf16")
        return Precision(device, torch.float16, f"CUDA sm{major}{minor}: fp16 (bf16 needs sm80)")
    flags = cpu_flags()
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        return Precision(device, torch.bfloat16, "CPU has AVX512_BF16/AMX: bf16 matmuls")
    return Precision(device, torch.float32, "CPU without native bf16: float32")
