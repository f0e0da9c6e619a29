"""Which form each weight matrix takes once loaded, and building it from its source in row
chunks (no float32 copy of the whole matrix, none of the model).

Forms: "float" (the model's dtype), "int8" (Int8Linear: per-row scales), "q4" (Q4Linear: 4-bit
blocks of 32 with float16 d and m; Q4_0/Q4_1 blocks map into it exactly, other sources are
rounded to it), "blocks" (GGUFLinear: the file's own blocks, any type its kernel takes; a fused
stack of several types is a GGUFSegments, each part on its own blocks). The
quantization picks the form:

    none               float
    int8, w8a8, ...    int8
    q4, q4-int8        layers q4; embedding and LM head int8, or q4 where the file stores them
                       in Q4_0/Q4_1 (exact, and 0.625 against 1.0 byte a weight); q4-int8 adds
                       an int8 copy to every q4 layer for large batches (1.625 bytes a weight)
    gguf               each matrix by its GGML type, FORM_BY_TYPE (what auto runs on a CPU
                       for a quantized GGUF): the file's own blocks where a kernel serves them
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from torch import Tensor, nn

from surge.models.formats.spec import ModelSpec
from surge.models.q4 import K_MULTIPLE, Q4Linear, pack_block_bytes, quantize_q4
from surge.models.quant import INT8_MODES, Int8Linear, quantize_int8
from surge.models.weights.gguf_blocks import Q4_BLOCK_TYPES, q4_scales
from surge.models.weights.source import MatrixSource, StackedMatrix

# The form of a matrix stored in each GGML type under "gguf" (and so under auto). One line a
# type: "blocks" runs the type's own blocks on GGUFLinear (surge/models/gguf_linear.py), once
# its kernel serves the type on the CPUs that matter.
FORM_BY_TYPE: dict[str, str] = {
    "Q4_0": "q4",
    "Q4_1": "q4",
    "Q8_0": "int8",
    # K-quants on their own blocks: a Llama-3.2-1B-shaped Q4_K_M decoded 10.4 tok/s on them
    # against 7.9 as int8 on the AVX2 EPYC, and loaded in 8.5 s against 20.8 (docs/precision.md).
    "Q4_K": "blocks",
    "Q5_K": "blocks",
    "Q6_K": "blocks",
}
# The types the "blocks" form runs (GGUFLinear's kernels); a stack may mix them.
BLOCK_KINDS = frozenset({"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
DEFAULT_FORM = "int8"  # types not listed (floats, other quants): what Surge ran them as before
EMBEDDING_FORMS = frozenset({"float", "int8", "q4"})  # the forms with a row lookup
Q4_MODES = ("q4", "q4-int8")
_Q4_KINDS = frozenset(t.name for t in Q4_BLOCK_TYPES)


def int8_mode(mode: str) -> str:
    """The Int8Linear mode int8 forms run under `mode` ("int8" where the mode is not one)."""
    return mode if mode in INT8_MODES else "int8"


def choose_form(kinds: Sequence[str], k: int, mode: str, role: str = "layer") -> str:
    """The form of a matrix `k` wide whose stacked members are stored as `kinds` (GGML type
    names, "float" for a tensor from safetensors). role: "layer", "head" or "embedding"."""
    if mode == "none":
        return "float"
    if mode in INT8_MODES:
        return "int8"
    file_q4 = bool(kinds) and all(kind in _Q4_KINDS for kind in kinds)
    if mode in Q4_MODES:
        # Layers are rounded to 4 bits whatever they were; the embedding and head only where
        # the file has them so (rounding a 128k-row head to 4 bits costs accuracy).
        form = "q4" if role == "layer" or file_q4 else "int8"
    elif mode == "gguf":
        forms = {FORM_BY_TYPE.get(kind, DEFAULT_FORM) for kind in kinds}
        if len(forms) == 1:
            form = forms.pop()
        elif "blocks" in forms and all(kind in BLOCK_KINDS for kind in kinds):
            # A stack of types with kernels (Q4_K_M's q/k in Q4_K, v in Q6_K): each part on
            # its own blocks (GGUFSegments), not the whole stack converted to int8.
            form = "blocks"
        else:
            form = DEFAULT_FORM
        if role == "embedding" and form not in EMBEDDING_FORMS:
            form = DEFAULT_FORM
    else:
        raise ValueError(f"unknown quantization {mode!r}")
    if form == "q4" and k % K_MULTIPLE:
        return "int8"  # whole pairs of blocks only
    return form


def form_bytes(
    form: str, n: int, k: int, elem: int, int8_copy: bool = False, kind: str = ""
) -> int:
    """Bytes of an [n, k] matrix in `form` (bias not counted); elem: the float dtype's size;
    kind: the GGML type the "blocks" form keeps."""
    if form == "blocks":
        block, size = GGML_QUANT_SIZES[T[kind]]
        return n * (k // block) * size
    if form == "float":
        return n * k * elem
    if form == "int8":
        return n * k + 8 * n  # int8 weights, a float32 scale and an int32 row sum a row
    if form == "q4":
        q4 = n * k // 2 + n * (k // 32) * 4
        return q4 + (n * k + 8 * n if int8_copy else 0)
    raise ValueError(f"unknown form {form!r}")


def build_int8(source: MatrixSource, bias: Tensor | None, mode: str, kernels: bool) -> Int8Linear:
    q = torch.empty(source.shape, dtype=torch.int8)
    scale = torch.empty(source.n, dtype=torch.float32)
    for a, b in source.chunks():
        q[a:b], scale[a:b] = quantize_int8(source.rows(a, b))
    return Int8Linear(q, scale, bias, int8_mode(mode), kernels)


def _leaves(source: MatrixSource) -> list[MatrixSource]:
    if isinstance(source, StackedMatrix):
        return [leaf for m in source.members for leaf in _leaves(m)]
    return [source]


def q4_arrays(source: MatrixSource) -> tuple[Tensor, Tensor]:
    """(qs, dm) of the q4 layout: Q4_0/Q4_1 blocks mapped bit for bit, anything else rounded
    from its float32 rows; a chunk of rows at a time."""
    n, k = source.shape
    qs = torch.empty(n, k // 2, dtype=torch.uint8)
    dm = torch.empty(n, 2, k // 32, dtype=torch.float16)
    qs_np, dm_np = qs.numpy(), dm.numpy()  # the file's blocks are repacked in numpy
    start = 0
    for leaf in _leaves(source):
        for a, b in leaf.chunks():
            rows = slice(start + a, start + b)
            if leaf.kind in _Q4_KINDS:
                qb, d, m = q4_scales(leaf.blocks(a, b).numpy(), T[leaf.kind])
                pack_block_bytes(qb, out=qs_np[rows])
                dm_np[rows, 0], dm_np[rows, 1] = d, m
            else:
                qs[rows], dm[rows] = quantize_q4(leaf.rows(a, b))
        start += leaf.n
    return qs, dm


def build_q4(
    source: MatrixSource, bias: Tensor | None, mode: str, kernels: bool, q4_kernels: bool
) -> Q4Linear:
    qs, dm = q4_arrays(source)
    int8 = build_int8(source, bias, "int8", kernels) if mode == "q4-int8" else None
    return Q4Linear(qs, dm, bias, q4_kernels, int8)


def _runs_of_kinds(source: MatrixSource) -> list[tuple[str, list[MatrixSource]]]:
    """The stack's members in order, consecutive members of one kind together."""
    runs: list[tuple[str, list[MatrixSource]]] = []
    for leaf in _leaves(source):
        if runs and runs[-1][0] == leaf.kind:
            runs[-1][1].append(leaf)
        else:
            runs.append((leaf.kind, [leaf]))
    return runs


def build_blocks(source: MatrixSource, bias: Tensor | None, kernels: bool) -> nn.Module:
    """GGUFLinear on the file's own blocks, copied out of the map once: resident bytes are the
    file's. A stack of several types: GGUFSegments, a GGUFLinear per run of one type."""
    from surge.models.gguf_linear import GGUFLinear, GGUFSegments  # the block kernels' module

    use = None if kernels else False
    runs = _runs_of_kinds(source)
    parts = []
    for kind, members in runs:
        n = sum(m.n for m in members)
        block, size = GGML_QUANT_SIZES[T[kind]]
        blocks = torch.empty(n, source.k // block * size, dtype=torch.uint8)
        start = 0
        for m in members:
            for a, b in m.chunks():
                blocks[start + a : start + b] = m.blocks(a, b)
            start += m.n
        one_bias = bias if len(runs) == 1 else None
        parts.append(GGUFLinear(blocks, int(T[kind]), n, source.k, one_bias, use))
    return parts[0] if len(parts) == 1 else GGUFSegments(parts, bias, use)


def matrix_kinds(
    kinds: Mapping[str, str] | None, prefix: str, members: Sequence[str], fused: str
) -> list[str]:
    """The stored kinds of a (possibly fused) matrix: its members' under `prefix`, else the
    fused name's (Phi-3 stores q/k/v fused), else "float" (no file table: safetensors)."""
    if kinds is None:
        return ["float"]
    found = [kinds[f"{prefix}.{m}.weight"] for m in members if f"{prefix}.{m}.weight" in kinds]
    if found:
        return found
    return [kinds.get(f"{prefix}.{fused}.weight", "float")]


def estimate_forms(
    spec: ModelSpec, dtype: torch.dtype, mode: str, kinds: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Bytes of the loaded weights by form, from the spec and the file's types (HF name ->
    GGML type name; None: all float) alone, nothing read: what the streaming build holds."""
    elem = torch.empty((), dtype=dtype).element_size()
    h, inter = spec.hidden_size, spec.intermediate_size
    q_size, kv_size = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    out: dict[str, int] = {}

    def add(form: str, n: int, k: int, kinds: Sequence[str], rows: Sequence[int] = ()) -> None:
        if form == "blocks" and len(kinds) == len(rows) > 1:  # a stack, each part its type
            size = sum(
                form_bytes(form, r, k, elem, kind=kind) for r, kind in zip(rows, kinds, strict=True)
            )
        else:
            size = form_bytes(form, n, k, elem, mode == "q4-int8", kinds[0])
        out[form] = out.get(form, 0) + size

    layer_mats = (
        ("self_attn", ("q_proj", "k_proj", "v_proj"), "qkv_proj", (q_size, kv_size, kv_size), h),
        ("self_attn", ("o_proj",), "o_proj", (h,), q_size),
        ("mlp", ("gate_proj", "up_proj"), "gate_up_proj", (inter, inter), h),
        ("mlp", ("down_proj",), "down_proj", (h,), inter),
    )
    for i in range(spec.num_layers):
        for part, members, fused, rows, k in layer_mats:
            prefix = f"model.layers.{i}.{part}"
            stored = matrix_kinds(kinds, prefix, members, fused)
            add(choose_form(stored, k, mode), sum(rows), k, stored, rows)
    embed = matrix_kinds(kinds, "model", ("embed_tokens",), "embed_tokens")
    add(choose_form(embed, h, mode, "embedding"), spec.vocab_size, h, embed)
    if not spec.tie_word_embeddings:
        head = [kinds.get("lm_head.weight", "float")] if kinds is not None else ["float"]
        add(choose_form(head, h, mode, "head"), spec.vocab_size, h, head)
    # Norms in dtype; q/k/v biases float32 beside quantized layers, else in dtype.
    norms = (2 * spec.num_layers + 1) * h * elem
    biases = spec.num_layers * (q_size + 2 * kv_size) if spec.attention_bias else 0
    out["float"] = out.get("float", 0) + norms + biases * (elem if mode == "none" else 4)
    return out


def estimate_weight_bytes(
    spec: ModelSpec, dtype: torch.dtype, mode: str = "none", kinds: Mapping[str, str] | None = None
) -> int:
    """What `weight_bytes` of the built model will be, from the spec (and the file's types)."""
    return sum(estimate_forms(spec, dtype, mode, kinds).values())


def resident_by_form(model: nn.Module) -> dict[str, int]:
    """Bytes of the loaded model's weights by form (q4 layers with their int8 copies apart as
    "int8 copy"), shared tensors once: what `weight_bytes` totals."""
    out: dict[str, int] = {}
    seen: set[int] = set()

    def count(form: str, tensors: Iterable[Tensor | None]) -> None:
        for t in tensors:
            if t is None or t.data_ptr() in seen or t.is_meta:
                continue
            seen.add(t.data_ptr())
            out[form] = out.get(form, 0) + t.numel() * t.element_size()

    for module in model.modules():
        if isinstance(module, Q4Linear):
            count("q4", [module.qs, module.dm])
            if module.int8 is not None:
                count("int8 copy", [module.int8.weight, module.int8.scale, module.int8.wsum])
        elif isinstance(module, Int8Linear):
            count("int8", [module.weight, module.scale, module.wsum])
        elif hasattr(module, "qtype") and isinstance(
            blocks := getattr(module, "blocks", 0), Tensor
        ):
            count("blocks", [blocks])  # GGUFLinear: the file's own blocks
    count("float", model.state_dict(keep_vars=True).values())  # norms, biases, float layers
    return out
