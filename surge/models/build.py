"""build_model(spec, weights, device, dtype, ...) -> the network, loaded and quantized."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from surge.models import amx
from surge.models.formats.spec import SUPPORTED_ARCHITECTURES, ModelSpec
from surge.models.kernels import load_int8_linear, load_q4_linear
from surge.models.llama import LlamaForCausalLM
from surge.models.q4 import K_MULTIPLE, Q4Linear
from surge.models.quant import QUANTIZATIONS, Int8Embedding, Int8Linear


def build_model(
    spec: ModelSpec,
    weights: Iterable[tuple[str, Tensor]],
    device: torch.device,
    dtype: torch.dtype,
    max_position: int,
    quantization: str = "none",
    use_kernels: bool = True,
) -> LlamaForCausalLM:
    """Build the network for `spec` on `device` without a random init, then load `weights`.

    quantization "int8" (and its variants, see `surge.models.quant`) quantizes every linear
    layer and the embedding from the float32 weights; norms stay in `dtype`.
    """
    if spec.architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {spec.architecture!r}")
    with torch.device("meta"):
        model = LlamaForCausalLM(spec, max_position)
    _materialize(model, device)
    model.load_weights(weights)
    if quantization == "none":
        model.to(dtype)
    else:
        # From the float32 weights, before any rounding to dtype; then only the float
        # parameters left (norms) are cast, so the int8 buffers' float32 scales stay float32.
        quantize_model(model, quantization, dtype, use_kernels)
        for param in model.parameters():
            param.data = param.data.to(dtype)
        if use_kernels and device.type == "cpu":
            amx.configure(model)  # VNNI or AMX tiles for the int8 GEMM, measured where it has AMX
    # Built after the cast: the cos/sin tables stay float32 (init on meta left them empty anyway).
    model.build_rotary(max_position, device)
    return model.eval().requires_grad_(False)


def _materialize(model: nn.Module, device: torch.device) -> None:
    """`model.to_empty(device=device)` without its empty_like of meta tensors, which runs
    through torch._refs and imports torch.fx's symbolic shapes: a third of a second of every
    engine start. Parameters stay parameters; one shared by two modules stays shared."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in made:
                    empty = torch.empty(p.shape, dtype=p.dtype, device=device)
                    made[id(p)] = nn.Parameter(empty, requires_grad=p.requires_grad)
                module._parameters[name] = made[id(p)]
        for name, b in module._buffers.items():
            if b is not None:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=device)


def quantize_model(model: nn.Module, mode: str, dtype: torch.dtype, use_kernels: bool) -> None:
    """Replace every nn.Linear and the token embedding of `model` with quantized versions, in
    place ("q4": 4-bit layers, int8 embedding and LM head).

    Norm weights and the rotary tables stay in their float dtypes (a few KB per layer).
    """
    if mode not in QUANTIZATIONS[1:]:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {mode!r}")
    device = next(model.parameters()).device
    kernels = use_kernels and device.type == "cpu" and load_int8_linear() is not None
    q4_kernels = kernels and load_q4_linear() is not None
    int8_mode = "int8" if mode == "q4" else mode
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                if mode == "q4" and name != "lm_head" and child.in_features % K_MULTIPLE == 0:
                    setattr(parent, name, Q4Linear.from_float(child, q4_kernels))
                else:
                    setattr(parent, name, Int8Linear.from_float(child, int8_mode, kernels))
            elif isinstance(child, nn.Embedding):
                setattr(parent, name, Int8Embedding.from_float(child, dtype, int8_mode, kernels))
