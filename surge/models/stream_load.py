"""Loading a network tensor by tensor into its final form: the model is built on the meta
device, and each weight, as it arrives, replaces its placeholder with the form it runs in
(surge/models/forms.py). Nothing holds a float32 copy of the model: the peak is the final
weights plus one tensor in flight (a fused q/k/v or gate/up group waits as views of the file).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor, nn

from surge.models.forms import (
    EMBEDDING_FORMS,
    build_blocks,
    build_int8,
    build_q4,
    choose_form,
)
from surge.models.kernels import load_int8_linear, load_q4_linear
from surge.models.llama import LlamaForCausalLM
from surge.models.q4 import Q4Linear
from surge.models.quant import Int8Embedding
from surge.models.weights.source import MatrixSource, StackedMatrix, as_source

# HF member name -> (the fused projection's name, its members in row order)
_FUSED = {
    "q_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "k_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "v_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "gate_proj": ("gate_up_proj", ("gate_proj", "up_proj")),
    "up_proj": ("gate_up_proj", ("gate_proj", "up_proj")),
}
Value = Tensor | MatrixSource


class StreamLoader:
    """put() each (HF name, tensor or matrix source) once; finish() checks nothing is missing.

    mode: the resolved quantization (forms.py); dtype: of floats (norms, a float model)."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        mode: str,
        dtype: torch.dtype,
        device: torch.device,
        use_kernels: bool,
    ) -> None:
        self.model = model
        self.mode = mode
        self.dtype = dtype
        self.device = device
        on_cpu = use_kernels and device.type == "cpu"
        self.kernels = on_cpu and load_int8_linear() is not None
        self.q4_kernels = self.kernels and load_q4_linear() is not None
        self.pending: dict[str, dict[str, Value]] = {}
        self.early_bias: dict[str, Tensor] = {}  # a bias that came before its weights
        self.forms: dict[str, str] = {}  # module name -> its form, for the load log

    def put(self, hf_name: str, value: Value) -> None:
        name = hf_name.removeprefix("model.")
        if name == "lm_head.weight" and self.model.lm_head is None:
            return  # tied: the embedding serves as the head
        parts = name.split(".")
        part = parts[-2] if len(parts) >= 2 else ""
        if part in _FUSED:
            fused, members = _FUSED[part]
            target = ".".join([*parts[:-2], fused, parts[-1]])
            group = self.pending.setdefault(target, {})
            group[part] = value
            if not all(m in group for m in members):
                return
            del self.pending[target]
            name = target
            if parts[-1] == "weight":
                value = StackedMatrix([as_source(group[m]) for m in members])
            else:
                value = torch.cat([_tensor(group[m]) for m in members])
        self._place(hf_name, name, value)
        if isinstance(value, MatrixSource):
            release(value)

    def finish(self) -> None:
        missing = [n for n, t in _tensors(self.model) if t.is_meta and "rotary" not in n]
        missing += list(self.early_bias)
        if self.pending or missing:
            names = sorted([*missing, *self.pending])
            raise ValueError(f"weights missing from the model files: {names[:8]}")

    # -- placing ------------------------------------------------------------------------------

    def _place(self, hf_name: str, name: str, value: Value) -> None:
        path, _, attr = name.rpartition(".")
        try:
            module = self.model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"unexpected weight {hf_name!r}") from None
        if isinstance(module, nn.Linear) and attr == "weight":
            _check(hf_name, as_source(value).shape, (module.out_features, module.in_features))
            self._set_module(path, self._linear(path, module, as_source(value)))
        elif not isinstance(module, nn.Linear) and attr == "bias" and "bias" in module._buffers:
            bias = _tensor(value).float().to(self.device)
            _check(hf_name, tuple(bias.shape), (int(getattr(module, "out_features", -1)),))
            if isinstance(module, Q4Linear):
                module.set_bias(bias)
            else:
                module.bias = bias
        elif isinstance(module, nn.Linear) and attr == "bias" and module.weight.is_meta:
            self.early_bias[path] = _tensor(value)
        elif isinstance(module, nn.Embedding) and attr == "weight":
            _check(hf_name, as_source(value).shape, tuple(module.weight.shape))
            self._set_module(path, self._embedding(path, module, as_source(value)))
        else:  # a float parameter: a norm, a float layer's bias
            param = module._parameters.get(attr)
            if param is None:
                raise ValueError(f"unexpected weight {hf_name!r}")
            tensor = _tensor(value)
            _check(hf_name, tuple(tensor.shape), tuple(param.shape))
            data = tensor.to(device=self.device, dtype=self.dtype)
            module._parameters[attr] = nn.Parameter(data, requires_grad=False)

    def _linear(self, path: str, module: nn.Linear, source: MatrixSource) -> nn.Module:
        role = "head" if path == "lm_head" else "layer"
        kinds = list(getattr(source, "kinds", (source.kind,)))
        form = choose_form(kinds, source.k, self.mode, role)
        self.forms[path] = form
        bias = self.early_bias.pop(path, None)
        if module.bias is not None and bias is None:
            bias = torch.empty(0)  # arrives later; a placeholder until then
        if form == "float":
            out = nn.Linear(source.k, source.n, bias=module.bias is not None, device="meta")
            out.weight = nn.Parameter(self._float(source), requires_grad=False)
            if bias is not None and bias.numel():
                out.bias = nn.Parameter(bias.to(self.device, self.dtype), requires_grad=False)
            return out
        real_bias = bias.float() if bias is not None and bias.numel() else None
        if form == "int8":
            layer: nn.Module = build_int8(source, real_bias, self.mode, self.kernels)
        elif form == "q4":
            layer = build_q4(source, real_bias, self.mode, self.kernels, self.q4_kernels)
        elif form == "blocks":
            layer = build_blocks(source, real_bias, self.kernels)
        else:
            raise ValueError(f"no builder for the {form!r} form")
        layer = layer.to(self.device)
        if module.bias is not None and real_bias is None:
            layer.register_buffer("bias", torch.empty(0, device="meta"))  # pending: finish()
        return layer

    def _embedding(self, path: str, module: nn.Embedding, source: MatrixSource) -> nn.Module:
        form = choose_form([source.kind], source.k, self.mode, "embedding")
        form = form if form in EMBEDDING_FORMS else "int8"
        self.forms[path] = form
        if form == "float":
            module.weight = nn.Parameter(self._float(source), requires_grad=False)
            return module
        if form == "q4":
            head: nn.Module = build_q4(source, None, self.mode, self.kernels, self.q4_kernels)
        else:
            head = build_int8(source, None, self.mode, self.kernels)
        return Int8Embedding(head.to(self.device), self.dtype)

    def _float(self, source: MatrixSource) -> Tensor:
        out = torch.empty(source.shape, dtype=self.dtype, device=self.device)
        for a, b in source.chunks():
            out[a:b] = source.rows(a, b)
        return out

    def _set_module(self, path: str, new: nn.Module) -> None:
        parent_path, _, child = path.rpartition(".")
        setattr(self.model.get_submodule(parent_path), child, new)


def load_streaming(
    model: LlamaForCausalLM,
    weights: Iterable[tuple[str, Value]],
    mode: str,
    dtype: torch.dtype,
    device: torch.device,
    use_kernels: bool,
) -> dict[str, str]:
    """Load `weights` into the meta-built `model` in their final forms; module -> form."""
    loader = StreamLoader(model, mode, dtype, device, use_kernels)
    for name, value in weights:
        loader.put(name, value)
    loader.finish()
    trim_heap()
    return loader.forms


def with_progress(
    weights: Iterable[tuple[str, Value]], total_bytes: int
) -> Iterator[tuple[str, Value]]:
    """`weights` as they are converted, with a progress bar of the file's bytes where stderr is
    a terminal (a first start converts for seconds to minutes; a log gets no bar)."""
    from tqdm import tqdm

    with tqdm(
        total=total_bytes or None,
        desc="loading weights",
        unit="B",
        unit_scale=True,
        leave=False,
        disable=not sys.stderr.isatty(),
    ) as bar:
        for name, value in weights:
            yield name, value
            bar.update(_nbytes(value))  # converted once the next one is asked for


def _nbytes(value: Value) -> int:
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    return int(getattr(value, "nbytes", 0))


def trim_heap() -> None:
    """Hand the heap's free pages back to the OS (glibc keeps the chunks the conversion freed,
    ~1x the weights of a small model, in the process's RSS otherwise)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: its allocator gives back on its own terms
    libc.malloc_trim(0)


def release(source: MatrixSource) -> None:
    """Drop the file's pages a converted matrix was read from out of this process's resident
    set (they stay in the page cache): the loaded model's RSS is its weights, not the file."""
    members = source.members if isinstance(source, StackedMatrix) else [source]
    for m in members:
        drop = getattr(m, "release", None)
        if drop is not None:
            drop()


def _tensor(value: Value) -> Tensor:
    if isinstance(value, MatrixSource):
        return value.dense()
    return value


def _tensors(model: nn.Module) -> Iterable[tuple[str, Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def _check(name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(f"weight {name!r} has shape {tuple(got)}, expected {tuple(want)}")
