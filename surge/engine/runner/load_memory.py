"""The memory a model takes once loaded and while it loads, from its spec and its file's types
(nothing read): the load's refusal line, and what `surge info` and the load log say of it."""

from __future__ import annotations

import torch

from surge.models.device import DTYPE_NAMES
from surge.models.formats.spec import ModelSpec
from surge.models.forms import estimate_weight_bytes

GIB = 1 << 30
MIB = 1 << 20


# A chunk of rows in flight (source.CHUNK_VALUES float32 values and the conversion's temporaries).
CHUNK_TRANSIENT_BYTES = 64 << 20


def load_peak_bytes(
    spec: ModelSpec, dtype: torch.dtype, quantization: str, kinds: dict[str, str] | None = None
) -> tuple[int, int]:
    """(the loaded weights' bytes, the load's peak): the streaming build (stream_load.py) holds
    the final forms plus one tensor in flight, converted a chunk of rows at a time; at most 2
    bytes a weight of the largest matrix (the embedding, the LM head or a fused gate/up: its
    int8 rows before they are packed for the kernel) and a chunk's transients."""
    final = estimate_weight_bytes(spec, dtype, quantization, kinds)
    h = spec.hidden_size
    largest = max(spec.vocab_size * h, 2 * spec.intermediate_size * h)
    return final, final + 2 * largest + CHUNK_TRANSIENT_BYTES


def load_memory_refusal(
    spec: ModelSpec,
    dtype: torch.dtype,
    quantization: str,
    available: int,
    kinds: dict[str, str] | None = None,
) -> str | None:
    """Why this model cannot be loaded in `available` bytes, in one line; None if it can:
    refusing before the peak beats being killed by the kernel's OOM killer halfway through."""
    final, need = load_peak_bytes(spec, dtype, quantization, kinds)
    if need <= available:
        return None
    form = quantization if quantization != "none" else DTYPE_NAMES.get(dtype, str(dtype))
    return (
        f"not enough memory to load this model: it needs {need / GIB:.1f} GiB while loading "
        f"(its weights {final / GIB:.1f} GiB as {form}, plus {(need - final) / GIB:.1f} GiB "
        f"for the largest tensor in flight), and {available / GIB:.1f} GiB is available"
    )


def describe_forms(by_form: dict[str, int]) -> str:
    """ "q4 600.1 MiB, int8 250.2 MiB, float 0.3 MiB", largest first."""
    parts = sorted(by_form.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{form} {size / MIB:.1f} MiB" for form, size in parts if size)


def versus_file(total: int, tensor_bytes: int) -> str:
    """ "1.11x the file's 767.0 MiB of tensors", or "" where the size of the file is unknown."""
    if not tensor_bytes:
        return ""
    return f"{total / tensor_bytes:.2f}x the file's {tensor_bytes / MIB:.1f} MiB of tensors"
