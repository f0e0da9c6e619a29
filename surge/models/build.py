"""build_model(spec, weights, device, dtype, ...) -> the network, loaded and quantized as it
streams in; quantize_model for a float network already in memory."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from surge.models import amx
from surge.models.formats.spec import SUPPORTED_ARCHITECTURES, ModelSpec
from surge.models.kernels import load_int8_linear, load_q4_linear
from surge.models.layout_cache import LayoutCache
from surge.models.llama import LlamaForCausalLM
from surge.models.q4 import K_MULTIPLE, Q4Linear
from surge.models.quant import QUANTIZATIONS, Int8Embedding, Int8Linear
from surge.models.stream_load import load_streaming
from surge.models.weights.source import MatrixSource


def build_model(
    spec: ModelSpec,
    weights: Iterable[tuple[str, Tensor | MatrixSource]],
    device: torch.device,
    dtype: torch.dtype,
    max_position: int,
    quantization: str = "none",
    use_kernels: bool = True,
    layout: LayoutCache | None = None,
) -> LlamaForCausalLM:
    """Build the network for `spec` on `device` without a random init, loading `weights` (HF
    names; float tensors or matrix sources over a file's blocks) one at a time straight into
    their final form (surge/models/forms.py): no float32 copy of the model is ever held.

    quantization "int8" (and its variants, see `surge.models.quant`), "q4", "q4-int8" and
    "gguf" quantize the linear layers and the embedding as they arrive; norms are in `dtype`.
    layout: where the converted weights are kept between starts (layout_cache.py); `weights`
    is then not read where they are stored.
    """
    if spec.architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {spec.architecture!r}")
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    with torch.device("meta"):
        model = LlamaForCausalLM(spec, max_position)
    if layout is None or not layout.restore(model, use_kernels):
        load_streaming(model, weights, quantization, dtype, device, use_kernels)
        if layout is not None:
            layout.store(model)
    if quantization != "none" and use_kernels and device.type == "cpu":
        amx.configure(model)  # VNNI or AMX tiles for the int8 GEMM, measured where it has AMX
    # The cos/sin tables, float32 whatever the model's dtype. The meta build made the global
    # ones on the CPU already (layers.RotaryEmbedding): a second build on a CPU is half a second
    # of a 128k-context model's start; sliding layers' own tables (Gemma 3) are made here.
    if device.type != "cpu" or spec.rope_local_theta is not None:
        model.build_rotary(max_position, device)
    return model.eval().requires_grad_(False)


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
    int8_mode = "int8" if mode in ("q4", "q4-int8", "gguf") else mode
    q4 = mode in ("q4", "q4-int8")  # "gguf" on floats: int8, as forms.FORM_BY_TYPE has them
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                if q4 and name != "lm_head" and child.in_features % K_MULTIPLE == 0:
                    layer = Q4Linear.from_float(child, q4_kernels, mode == "q4-int8")
                    setattr(parent, name, layer)
                else:
                    setattr(parent, name, Int8Linear.from_float(child, int8_mode, kernels))
            elif isinstance(child, nn.Embedding):
                setattr(parent, name, Int8Embedding.from_float(child, dtype, int8_mode, kernels))
