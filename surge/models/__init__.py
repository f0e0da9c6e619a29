"""Model networks and their files. Knows nothing of requests, schedulers or HTTP."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from surge.models.layers import RotaryEmbedding
from surge.models.llama import LlamaForCausalLM
from surge.models.spec import ModelSpec

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")


def build_model(
    spec: ModelSpec,
    weights: Iterable[tuple[str, Tensor]],
    device: torch.device,
    dtype: torch.dtype,
    max_position: int,
) -> LlamaForCausalLM:
    """Build the network for `spec` on `device` without a random init, then load `weights`."""
    if spec.architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {spec.architecture!r}")
    with torch.device("meta"):
        model = LlamaForCausalLM(spec, max_position)
    model.to_empty(device=device)
    model.load_weights(weights)
    model.to(dtype)
    # Built after the cast: the cos/sin tables stay float32 (init on meta left them empty anyway).
    model.rotary = RotaryEmbedding(spec.head_dim, spec.rope_theta, spec.rope_scaling, max_position)
    model.rotary.to(device)
    return model.eval().requires_grad_(False)


__all__ = ["SUPPORTED_ARCHITECTURES", "LlamaForCausalLM", "build_model"]
