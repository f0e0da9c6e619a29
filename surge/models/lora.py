"""LoRA adapters (PEFT's format) served beside the base weights, several in one batch.

Each adapted projection keeps its base layer, whatever its precision or quantization, and holds
every loaded adapter's low-rank pair in a fixed slot:

    y = base(x);   y[rows of slot s] += (x[rows] @ A[s].T) @ B[s].T      (the scaling is in B)

(B is stored transposed.)

q/k/v and gate/up are fused projections here: an adapter's pairs for the parts stack along the
rank (A [parts * R, in]) and its B is block-diagonal ([parts * R, out]), so one fused layer takes
two matmuls per adapter in the step whichever parts the adapter trains. Ranks below R are
zero-padded, which changes nothing. Base rows pay nothing: with no adapter in a step, the wrapper
is the base layer plus an empty loop (and the runner keeps its compiled or fused paths).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from surge.models.formats.spec import ModelSpec

# PEFT module name -> (its block in a decoder layer, the fused projection here, the part's
# index in it); parts in order.
TARGETS: dict[str, tuple[str, str, int]] = {
    "q_proj": ("self_attn", "qkv_proj", 0),
    "k_proj": ("self_attn", "qkv_proj", 1),
    "v_proj": ("self_attn", "qkv_proj", 2),
    "o_proj": ("self_attn", "o_proj", 0),
    "gate_proj": ("mlp", "gate_up_proj", 0),
    "up_proj": ("mlp", "gate_up_proj", 1),
    "down_proj": ("mlp", "down_proj", 0),
}
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\."
    r"(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$"
)


class LoRAError(ValueError):
    """An adapter that cannot be served with this model (the message says why)."""


@dataclass(frozen=True, slots=True)
class LoRAWeights:
    """One adapter read from disk: per (layer, PEFT module), A [r, in] and B [out, r] with the
    scaling already multiplied into B."""

    path: str
    rank: int  # the largest rank of any module
    pairs: dict[tuple[int, str], tuple[Tensor, Tensor]]


def read_peft_adapter(path: str | Path, spec: ModelSpec, max_rank: int) -> LoRAWeights:
    """Read and check a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors)."""
    folder = Path(path)
    cfg_file = folder / "adapter_config.json"
    if not cfg_file.is_file():
        raise LoRAError(f"{folder}: no adapter_config.json (a PEFT LoRA folder is expected)")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LoRAError(f"{cfg_file}: {e}") from None
    _check_config(cfg, cfg_file)
    tensors = _read_tensors(folder)
    halves: dict[tuple[int, str], dict[str, Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise LoRAError(
                f"{folder.name}: unsupported adapter tensor {key!r} (only LoRA on the decoder "
                f"layers' {', '.join(TARGETS)} is served)"
            )
        layer, module, half = int(m.group(1)), m.group(2), m.group(3)
        if module not in TARGETS:
            raise LoRAError(f"{folder.name}: LoRA on {module!r} is not supported")
        if layer >= spec.num_layers:
            raise LoRAError(f"{folder.name}: layer {layer}, the model has {spec.num_layers}")
        halves.setdefault((layer, module), {})[half] = t
    if not halves:
        raise LoRAError(f"{folder.name}: the adapter has no LoRA weights")
    pairs: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
    rank = 0
    for (layer, module), ab in halves.items():
        if set(ab) != {"A", "B"}:
            raise LoRAError(f"{folder.name}: layer {layer} {module} lacks lora_A or lora_B")
        a, b = ab["A"].float(), ab["B"].float()
        in_f, out_f = module_shape(spec, module)
        r = a.shape[0]
        if a.shape != (r, in_f) or b.shape != (out_f, r):
            raise LoRAError(
                f"{folder.name}: layer {layer} {module}: lora_A {tuple(a.shape)} / lora_B "
                f"{tuple(b.shape)} do not fit this model ({in_f} -> {out_f})"
            )
        if r > max_rank:
            raise LoRAError(
                f"{folder.name}: rank {r} is above --max-lora-rank {max_rank}; raise it"
            )
        rank = max(rank, r)
        pairs[(layer, module)] = (a, b * _scaling(cfg, peft_module_name(layer, module), r))
    return LoRAWeights(str(folder), rank, pairs)


def _check_config(cfg: dict[str, object], where: Path) -> None:
    kind = str(cfg.get("peft_type", "LORA")).upper()
    if kind != "LORA":
        raise LoRAError(f"{where}: peft_type {kind!r}; only LORA adapters are served")
    unsupported = {
        "use_dora": "DoRA",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)",
        "lora_bias": "lora_bias",
    }
    for field, what in unsupported.items():
        if cfg.get(field):
            raise LoRAError(f"{where}: {what} is not supported")
    if cfg.get("bias", "none") != "none":
        raise LoRAError(f"{where}: bias={cfg.get('bias')!r} changes base biases; not supported")
    if cfg.get("modules_to_save"):
        raise LoRAError(f"{where}: modules_to_save (fully trained layers) is not supported")


def _read_tensors(folder: Path) -> dict[str, Tensor]:
    st = folder / "adapter_model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = folder / "adapter_model.bin"
    if pt.is_file():  # older PEFT; weights_only keeps pickle from running code
        loaded: dict[str, Tensor] = torch.load(pt, map_location="cpu", weights_only=True)
        return loaded
    raise LoRAError(f"{folder}: no adapter_model.safetensors")


def _pattern_value(patterns: object, module_name: str) -> object | None:
    """PEFT's rank_pattern / alpha_pattern: a key matches a module name ending with it."""
    if not isinstance(patterns, dict):
        return None
    for key, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?{key}", module_name):
            return value
    return None


def _scaling(cfg: dict[str, object], module_name: str, r: int) -> float:
    alpha = _pattern_value(cfg.get("alpha_pattern"), module_name)
    if alpha is None:
        alpha = cfg.get("lora_alpha", 8)
    assert isinstance(alpha, int | float)
    return float(alpha) / (math.sqrt(r) if cfg.get("use_rslora") else r)


def peft_module_name(layer: int, module: str) -> str:
    """A PEFT module's name in the HF model: model.layers.3.self_attn.q_proj"""
    return f"model.layers.{layer}.{TARGETS[module][0]}.{module}"


def module_shape(spec: ModelSpec, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a PEFT module name."""
    h, inter = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }[module]


class LoRABatch:
    """Which rows of the current step take which slot: set by the runner before an eager
    forward, cleared after; read by every LoRALinear. Each group: (slot, row indices), or
    (slot, None) when every row of the step takes that slot."""

    def __init__(self) -> None:
        self.groups: list[tuple[int, Tensor | None]] = []

    def set_rows(self, row_slots: list[int], device: torch.device) -> None:
        slots = sorted(set(row_slots) - {-1})
        if len(slots) == 1 and -1 not in row_slots:
            self.groups = [(slots[0], None)]
            return
        rows = torch.tensor(row_slots, device=device)
        self.groups = [(s, torch.nonzero(rows == s).flatten()) for s in slots]

    def clear(self) -> None:
        self.groups = []


class LoRALinear(nn.Module):
    """A projection with its base layer and `max_loras` slots of low-rank pairs."""

    lora_a: Tensor  # [max_loras, parts * max_rank, in_features]
    # B transposed, [max_loras, parts * max_rank, out_features], block-diagonal by part: a rank
    # column's weights for all channels in a row, so B (A x) is a sum of contiguous rows.
    lora_bt: Tensor

    def __init__(
        self,
        base: nn.Module,
        in_features: int,
        part_sizes: tuple[int, ...],
        max_loras: int,
        max_rank: int,
        batch: LoRABatch,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.base = base
        self.part_sizes = part_sizes
        self.max_rank = max_rank
        self.batch = batch
        parts, out = len(part_sizes), sum(part_sizes)
        # Buffers, not parameters: nothing trains them, and the base's checks ignore them.
        shape_a = (max_loras, parts * max_rank, in_features)
        shape_b = (max_loras, parts * max_rank, out)
        self.register_buffer("lora_a", torch.zeros(shape_a, dtype=dtype, device=device), False)
        self.register_buffer("lora_bt", torch.zeros(shape_b, dtype=dtype, device=device), False)

    def set_slot(self, slot: int, pairs: list[tuple[Tensor, Tensor] | None]) -> None:
        """Write one adapter's pairs (one per part, None: that part untouched) into a slot."""
        a, bt = self.lora_a[slot], self.lora_bt[slot]
        a.zero_()
        bt.zero_()
        r_max, offset = self.max_rank, 0
        for i, (size, pair) in enumerate(zip(self.part_sizes, pairs, strict=True)):
            if pair is not None:
                pa, pb = pair
                r = pa.shape[0]
                a[i * r_max : i * r_max + r].copy_(pa)
                bt[i * r_max : i * r_max + r, offset : offset + size].copy_(pb.t())
            offset += size

    def clear_slot(self, slot: int) -> None:
        self.lora_a[slot].zero_()
        self.lora_bt[slot].zero_()

    def forward(self, x: Tensor) -> Tensor:
        y: Tensor = self.base(x)
        for slot, rows in self.batch.groups:
            a, bt = self.lora_a[slot], self.lora_bt[slot]
            xs = x if rows is None else x.index_select(0, rows)
            delta = ((xs.to(a.dtype) @ a.t()) @ bt).to(y.dtype)
            y = y + delta if rows is None else y.index_add(0, rows, delta)
        return y


class LoRAModel:
    """The model's adapted projections, by (layer, fused name), and the shared step batch."""

    def __init__(
        self,
        model: nn.Module,
        spec: ModelSpec,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.spec = spec
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.batch = LoRABatch()
        self.layers: dict[tuple[int, str], LoRALinear] = {}
        fused: dict[str, list[str]] = {}  # fused projection -> its PEFT modules, in part order
        for module, (_, name, _) in TARGETS.items():
            fused.setdefault(name, []).append(module)
        for i, layer in enumerate(model.layers):  # type: ignore[arg-type]
            for name, modules in fused.items():
                owner = getattr(layer, TARGETS[modules[0]][0])
                in_f = module_shape(spec, modules[0])[0]
                parts = tuple(module_shape(spec, m)[1] for m in modules)
                wrapped = LoRALinear(
                    getattr(owner, name),
                    in_f,
                    parts,
                    max_loras,
                    max_rank,
                    self.batch,
                    dtype,
                    device,
                )
                setattr(owner, name, wrapped)
                self.layers[(i, name)] = wrapped

    def load(self, slot: int, weights: LoRAWeights) -> None:
        fused: dict[tuple[int, str], list[tuple[Tensor, Tensor] | None]] = {}
        for (layer, name), mod in self.layers.items():
            fused[(layer, name)] = [None] * len(mod.part_sizes)
        for (layer, module), pair in weights.pairs.items():
            _, name, part = TARGETS[module]
            fused[(layer, name)][part] = pair
        for key, pairs in fused.items():
            self.layers[key].set_slot(slot, pairs)

    def unload(self, slot: int) -> None:
        for mod in self.layers.values():
            mod.clear_slot(slot)

    def slot_bytes(self) -> int:
        """Memory of one slot across the model."""
        return sum(
            (m.lora_a[0].numel() + m.lora_bt[0].numel()) * m.lora_a.element_size()
            for m in self.layers.values()
        )
