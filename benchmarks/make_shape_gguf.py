"""A GGUF with a named model's real shapes and RANDOM weights, for speed benchmarks (issue #45).

REAL SHAPES, RANDOM WEIGHTS: a file written here measures speed only (tok/s, TTFT, start, memory),
never accuracy; its text is noise. Speed depends on the shapes and the storage format, not on
the values; real weights remain the test of accuracy. Say so wherever its figures are written.

    python benchmarks/make_shape_gguf.py llama-3.2-1b            # F16, then Q4_K_M, Q4_0, Q8_0
    python benchmarks/make_shape_gguf.py llama-3.1-8b --types Q4_K_M --drop-f16
    python benchmarks/make_shape_gguf.py llama-3.2-1b --layers 2 --no-quantize  # a quick check
    python benchmarks/make_shape_gguf.py llama-3.1-8b --types Q4_0 --direct --drop-f16
    python benchmarks/make_shape_gguf.py --list

What it writes, in --out-dir (default ~/.cache/surge/shapes): NAME.F16.gguf (NAME is the shape,
with -<N>L / -v<N> when --layers / --vocab override it), then NAME.<TYPE>.gguf for each --types
entry, quantized by llama.cpp's `llama-quantize` (--quantize PATH; by default the one
`BUILD_ONLY=1 bash benchmarks/bench_llamacpp.sh` builds under $LLAMACPP_WORK, /tmp/surge-llamacpp).
Files already there are kept (--force writes them again); each is written under a .part name
and renamed when complete, so a file with its final name is whole.

The file is what llama.cpp's convert_hf_to_gguf.py writes for the architecture: its metadata
keys (general.*, <arch>.* shapes, RoPE base, context length, file_type; Llama 3's RoPE scaling as
the rope_freqs tensor), matrices F16, norms (ones) and biases F32. Weights are normal(0, 0.02),
seeded per tensor (--seed), written tensor by tensor: memory stays near the largest tensor (an
8B's embedding, 1 GB), never the whole file. The tokenizer is SmolLM2-135M's (its GGUF's
tokenizer.* metadata, chat template and special ids kept), padded with unused "[PAD<id>]"
tokens up to the shape's vocabulary, as the converter pads, so the embedding and LM head cost
what the real ones do; for a vocabulary below SmolLM2's (Mistral's 32,768) it is cut to the
first tokens and the merges among them.

Time: drawing the values is most of it, ~25 ns a parameter on one core (the 2-layer 1B cut,
0.38B parameters, took 9 s on a busy 2-core machine), so an 8B takes minutes, plus 16 GB of
writes; then each llama-quantize run.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from surge.models.formats.gguf_file import GGUFFile

STD = 0.02  # normal(0, STD): what HF initialises these models with (initializer_range)
CHUNK = 1 << 24  # random values drawn per step (64 MiB of float32)
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
               "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K")  # fmt: skip
DEFAULT_TYPES = "Q4_K_M,Q4_0,Q8_0"
# What gguf.quants quantizes itself (--direct): every matrix in the type, the embedding and LM
# head too, where llama-quantize stores those as Q6_K (so its Q4_0 file is a little larger).
DIRECT_TYPES = ("Q4_0", "Q4_1", "Q8_0")
LLAMACPP_WORK = Path(os.environ.get("LLAMACPP_WORK", "/tmp/surge-llamacpp"))
DEFAULT_QUANTIZE = LLAMACPP_WORK / "build" / "bin" / "llama-quantize"
_UNUSED = int(gguf.TokenType.UNUSED)  # the type convert_hf_to_gguf gives its [PAD] tokens
# Size of a quantized file against its F16 (Q8_0 is 8.5 bits a weight): for the disk check.
_QUANT_SHARE = 0.56


@dataclass(frozen=True)
class Shape:
    """What a config.json says about a model's tensors, as the GGUF stores it."""

    arch: str  # general.architecture (llama.cpp's name; Mistral is a "llama")
    title: str  # general.name
    size_label: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int
    tied: bool  # no output.weight: the LM head is the embedding
    rope_theta: float
    context: int
    rms_eps: float
    llama3_rope_factor: float | None = None  # Llama 3.1+'s RoPE scaling (rope_freqs tensor)
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3

    @property
    def params(self) -> int:
        return sum(t.size for t in tensor_plan(self))


SHAPES = {
    "llama-3.2-1b": Shape("llama", "Llama 3.2 1B", "1B", 2048, 16, 32, 8, 8192, 128256, 64,
                          True, 500000.0, 131072, 1e-5, llama3_rope_factor=32.0),
    "llama-3.1-8b": Shape("llama", "Llama 3.1 8B", "8B", 4096, 32, 32, 8, 14336, 128256, 128,
                          False, 500000.0, 131072, 1e-5, llama3_rope_factor=8.0),
    "qwen2.5-1.5b": Shape("qwen2", "Qwen2.5 1.5B", "1.5B", 1536, 28, 12, 2, 8960, 151936, 128,
                          True, 1000000.0, 32768, 1e-6, qkv_bias=True),
    "qwen3-1.7b": Shape("qwen3", "Qwen3 1.7B", "1.7B", 2048, 28, 16, 8, 6144, 151936, 128,
                        True, 1000000.0, 40960, 1e-6, qk_norm=True),
    # v0.3: "mistral" in general.name is how Surge (as llama.cpp) tells it from a Llama.
    "mistral-7b": Shape("llama", "Mistral 7B v0.3", "7B", 4096, 32, 32, 8, 14336, 32768, 128,
                        False, 1000000.0, 32768, 1e-5),
    # For tests: Llama 3's layout (RoPE scaling, GQA, untied) at toy sizes, SmolLM2's vocabulary
    # plus 128 padding tokens.
    "tiny": Shape("llama", "Tiny Llama", "tiny", 64, 2, 4, 2, 128, 49280, 16,
                  False, 500000.0, 4096, 1e-5, llama3_rope_factor=32.0),
    "tiny-qwen2": Shape("qwen2", "Tiny Qwen2", "tiny", 64, 2, 4, 2, 128, 49280, 16,
                        True, 1000000.0, 4096, 1e-6, qkv_bias=True),
    "tiny-qwen3": Shape("qwen3", "Tiny Qwen3", "tiny", 64, 2, 4, 2, 128, 49280, 32,
                        True, 1000000.0, 4096, 1e-6, qk_norm=True),
}  # fmt: skip


@dataclass(frozen=True)
class TensorSpec:
    name: str  # llama.cpp's tensor name
    dims: tuple[int, ...]  # numpy order: [out_features, in_features] for a matrix
    kind: str  # "matrix" (F16, random), "bias" (F32, random), "norm" (F32, ones), "rope"

    @property
    def dtype(self) -> type[np.floating[Any]]:
        return np.float16 if self.kind == "matrix" else np.float32

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


def tensor_plan(shape: Shape) -> list[TensorSpec]:
    """Every tensor of the file, in the order it is written (the converter's names)."""
    h, hd = shape.hidden, shape.head_dim
    q, kv = shape.heads * hd, shape.kv_heads * hd
    plan = []
    if shape.llama3_rope_factor is not None:
        plan.append(TensorSpec("rope_freqs.weight", (hd // 2,), "rope"))
    plan.append(TensorSpec("token_embd.weight", (shape.vocab, h), "matrix"))
    for i in range(shape.layers):
        p = f"blk.{i}."
        layer = [TensorSpec(p + "attn_norm.weight", (h,), "norm")]
        for part, rows in (("q", q), ("k", kv), ("v", kv)):
            layer.append(TensorSpec(f"{p}attn_{part}.weight", (rows, h), "matrix"))
            if shape.qkv_bias:
                layer.append(TensorSpec(f"{p}attn_{part}.bias", (rows,), "bias"))
        if shape.qk_norm:
            layer += [TensorSpec(p + "attn_q_norm.weight", (hd,), "norm"),
                      TensorSpec(p + "attn_k_norm.weight", (hd,), "norm")]  # fmt: skip
        layer += [
            TensorSpec(p + "attn_output.weight", (h, q), "matrix"),
            TensorSpec(p + "ffn_norm.weight", (h,), "norm"),
            TensorSpec(p + "ffn_gate.weight", (shape.ffn, h), "matrix"),
            TensorSpec(p + "ffn_up.weight", (shape.ffn, h), "matrix"),
            TensorSpec(p + "ffn_down.weight", (h, shape.ffn), "matrix"),
        ]
        plan += layer
    plan.append(TensorSpec("output_norm.weight", (h,), "norm"))
    if not shape.tied:
        plan.append(TensorSpec("output.weight", (shape.vocab, h), "matrix"))
    return plan


def llama3_rope_divisors(shape: Shape) -> np.ndarray:
    """What the converter stores as rope_freqs for Llama 3 scaling (low/high frequency factors
    1 and 4, original context 8192: the values of every Llama 3.1/3.2 config)."""
    factor, low, high, original = float(shape.llama3_rope_factor or 1.0), 1.0, 4.0, 8192.0
    inv_freq = 1.0 / shape.rope_theta ** (np.arange(0, shape.head_dim, 2) / shape.head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    divisors = np.where(
        wavelen < original / high,
        1.0,
        np.where(wavelen > original / low, factor, 1.0 / ((1 - smooth) / factor + smooth)),
    )
    return divisors.astype(np.float32)


def tensor_values(spec: TensorSpec, shape: Shape, seed: int) -> np.ndarray:
    """The tensor's values; random ones drawn in chunks straight into the stored dtype."""
    if spec.kind == "norm":
        return np.ones(spec.dims, np.float32)
    if spec.kind == "rope":
        return llama3_rope_divisors(shape)
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    out = np.empty(spec.dims, spec.dtype)
    flat = out.reshape(-1)
    buf = np.empty(min(CHUNK, flat.size), np.float32)
    for start in range(0, flat.size, CHUNK):
        part = buf[: min(CHUNK, flat.size - start)]
        rng.standard_normal(dtype=np.float32, out=part)
        part *= STD
        flat[start : start + part.size] = part
    return out


def fit_vocab(fields: dict[str, Any], size: int) -> dict[str, Any]:
    """The source's tokenizer.* metadata with its vocabulary padded (or cut) to `size` tokens."""
    out = {k: v for k, v in fields.items() if k.startswith("tokenizer.")}
    tokens = list(out["tokenizer.ggml.tokens"])
    types = list(out.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if size >= len(tokens):
        pads = [f"[PAD{i}]" for i in range(len(tokens), size)]
        if clash := set(pads) & set(tokens):
            raise SystemExit(f"the source vocabulary already holds {sorted(clash)[:3]}")
        tokens += pads
        types += [_UNUSED] * len(pads)
    else:
        # Cut: the first `size` tokens, and the merges whose parts and result all remain. The
        # single bytes (llama.cpp's fallback for any text) come first in a byte-level vocabulary.
        singles = max(i for i, t in enumerate(tokens) if len(t) == 1) + 1
        if size < singles:
            raise SystemExit(f"a vocabulary of {size} cuts off byte tokens (keep {singles})")
        tokens, types = tokens[:size], types[:size]
        kept = set(tokens)
        merges = []
        for merge in out.get("tokenizer.ggml.merges") or []:
            left, _, right = merge.partition(" ")
            if left in kept and right in kept and left + right in kept:
                merges.append(merge)
        out["tokenizer.ggml.merges"] = merges
        for key, value in fields.items():
            if key.endswith("_token_id") and isinstance(value, int) and value >= size:
                raise SystemExit(f"vocabulary {size} cuts off {key} ({value})")
    out["tokenizer.ggml.tokens"], out["tokenizer.ggml.token_type"] = tokens, types
    return out


def add_metadata(
    writer: gguf.GGUFWriter, shape: Shape, tokenizer: dict[str, Any], kind: str = "F16"
) -> None:
    """The keys llama.cpp's converter writes for this architecture, in its order."""
    writer.add_type("model")
    writer.add_name(f"{shape.title} (real shapes, random weights)")
    writer.add_description(
        "Real shapes, random weights (benchmarks/make_shape_gguf.py): for speed only, never "
        "accuracy. Tokenizer: SmolLM2-135M's, padded to the vocabulary."
    )
    writer.add_size_label(shape.size_label)
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    # Written where config.json names head_dim: every config here but Qwen2.5's.
    if shape.arch != "qwen2" or shape.head_dim != shape.hidden // shape.heads:
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    writer.add_file_type(int(getattr(gguf.LlamaFileType, f"MOSTLY_{kind}")))
    if shape.arch == "llama":  # the converter's Llama class alone writes these two
        writer.add_vocab_size(shape.vocab)
        writer.add_rope_dimension_count(shape.head_dim)
    for key, value in tokenizer.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)  # token ids
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, list(value))  # strings; token types as int32, as converted
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def quantized_rows(values: np.ndarray, kind: gguf.GGMLQuantizationType) -> np.ndarray:
    """gguf.quants' blocks of a matrix, rows in chunks (its float32 transients stay small)."""
    rows = max(1, CHUNK // values.shape[1])
    return np.concatenate([gguf.quants.quantize(values[a : a + rows].astype(np.float32), kind)
                           for a in range(0, len(values), rows)])  # fmt: skip


def write_shape_gguf(
    shape: Shape,
    path: Path,
    tokenizer_from: Path,
    seed: int = 0,
    progress: bool = True,
    kind: str = "F16",
) -> Path:
    """Write the file to `path` (under a .part name first), one tensor in memory at a time:
    matrices F16, or (kind, one of DIRECT_TYPES) quantized by gguf.quants from the same values."""
    tokenizer = fit_vocab(GGUFFile(tokenizer_from).fields, shape.vocab)
    plan = tensor_plan(shape)
    part = path.with_name(path.name + ".part")
    writer = gguf.GGUFWriter(part, shape.arch)
    add_metadata(writer, shape, tokenizer, kind)
    qtype = None if kind == "F16" else gguf.GGMLQuantizationType[kind]
    for spec in plan:
        if qtype is not None and spec.kind == "matrix":
            dims = gguf.quants.quant_shape_to_byte_shape(spec.dims, qtype)
            writer.add_tensor_info(spec.name, dims, np.dtype(np.uint8), math.prod(dims), qtype)
            continue
        writer.add_tensor_info(spec.name, spec.dims, np.dtype(spec.dtype), spec.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    start = shown = time.monotonic()
    done, total = 0, sum(s.size for s in plan)
    end = "\r" if sys.stderr.isatty() else "\n"
    for spec in plan:
        values = tensor_values(spec, shape, seed)
        if qtype is not None and spec.kind == "matrix":
            writer.write_tensor_data(quantized_rows(values, qtype))
        else:
            writer.write_tensor_data(values)
        done += values.size
        del values
        now = time.monotonic()
        last = spec is plan[-1]
        if progress and (now - shown > 2 or last):
            shown = now
            line = f"  {done / total:6.1%} of {total / 1e9:.2f}B parameters, {now - start:.0f} s"
            print(line, end="\n" if last else end, file=sys.stderr, flush=True)
    writer.close()
    os.replace(part, path)
    return path


def quantize(binary: Path, source: Path, target: Path, kind: str) -> None:
    """llama-quantize SOURCE TARGET KIND, its log beside TARGET; TARGET appears when complete."""
    part = target.with_name(target.name + ".part")
    log = target.with_name(target.name + ".quantize.log")
    with log.open("wb") as out:
        done = subprocess.run(
            [str(binary), str(source), str(part), kind, str(os.cpu_count() or 1)],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        part.unlink(missing_ok=True)
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise SystemExit(f"llama-quantize {kind} failed ({done.returncode}):\n" + "\n".join(tail))
    os.replace(part, target)


def describe(path: Path) -> str:
    """One line: the file's size and what Surge reads from it (its spec, vocabulary, format)."""
    from surge.models.formats.model_files import open_model

    files = open_model(path)
    s = files.spec
    return (
        f"{path}  {path.stat().st_size / 1e9:.2f} GB  {s.architecture}, {s.num_layers} layers, "
        f"hidden {s.hidden_size}, heads {s.num_heads}/{s.num_kv_heads}, FFN "
        f"{s.intermediate_size}, vocab {s.vocab_size} (tokenizer {files.tokenizer.vocab_size}), "
        f"{'tied' if s.tie_word_embeddings else 'untied'}, layers {files.layer_format}"
    )


def _shape_of(args: argparse.Namespace) -> tuple[Shape, str]:
    shape, stem = SHAPES[args.shape], args.shape
    if args.layers is not None:
        shape, stem = replace(shape, layers=args.layers), f"{stem}-{args.layers}L"
    if args.vocab is not None:
        shape, stem = replace(shape, vocab=args.vocab), f"{stem}-v{args.vocab}"
    if shape.layers < 1 or shape.vocab < 1:
        raise SystemExit("--layers and --vocab must be >= 1")
    return shape, stem


def _quantize_plan(args: argparse.Namespace) -> tuple[Path | None, list[str]]:
    """The llama-quantize binary and the types to make (none: no binary, or --no-quantize)."""
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    if bad := [t for t in types if t not in QUANT_TYPES]:
        raise SystemExit(f"unknown --types {bad}; known: {', '.join(QUANT_TYPES)}")
    if args.no_quantize or not types:
        return None, []
    if args.direct:
        if bad := [t for t in types if t not in DIRECT_TYPES]:
            raise SystemExit(f"--direct makes {', '.join(DIRECT_TYPES)} only, not {bad}")
        return None, types
    binary = Path(args.quantize) if args.quantize else DEFAULT_QUANTIZE
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        if args.quantize:
            raise SystemExit(f"--quantize {binary}: not an executable file")
        build = "BUILD_ONLY=1 bash benchmarks/bench_llamacpp.sh"
        print(f"no llama-quantize at {binary} (build it: {build}, or --direct for "
              f"{'/'.join(DIRECT_TYPES)}): F16 only", file=sys.stderr)  # fmt: skip
        return None, []
    return binary, types


def _check_disk(out_dir: Path, f16_bytes: int, write_f16: bool, n_types: int) -> None:
    need = f16_bytes * (write_f16 + _QUANT_SHARE * n_types)
    free = shutil.disk_usage(out_dir).free
    if need > free:
        raise SystemExit(f"{out_dir}: needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")


def _iter_outputs(args: argparse.Namespace) -> Iterator[Path]:
    shape, stem = _shape_of(args)
    binary, types = _quantize_plan(args)
    if args.drop_f16 and not types:
        raise SystemExit("--drop-f16 keeps nothing: no llama-quantize types to make")
    out_dir = Path(args.out_dir).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    f16 = out_dir / f"{stem}.F16.gguf"
    targets = [(t, out_dir / f"{stem}.{t}.gguf") for t in types]
    todo = [(t, p) for t, p in targets if args.force or not p.exists()]
    f16_bytes = sum(s.nbytes for s in tensor_plan(shape))
    wanted_f16 = (todo and not args.direct) or not args.drop_f16
    write_f16 = bool(wanted_f16) and (args.force or not f16.exists())
    _check_disk(out_dir, f16_bytes, write_f16, len(todo))
    tokenizer_from = Path(args.tokenizer_from) if args.tokenizer_from else _smollm2()
    if write_f16:
        print(f"writing {f16} ({shape.params / 1e9:.2f}B parameters, {f16_bytes / 1e9:.2f} GB; "
              "real shapes, random weights)", file=sys.stderr)  # fmt: skip
        write_shape_gguf(shape, f16, tokenizer_from, seed=args.seed)
    if wanted_f16 and not args.drop_f16:
        yield f16
    for kind, target in targets:
        if (kind, target) in todo and args.direct:
            print(f"writing {target} (gguf.quants, every matrix {kind})", file=sys.stderr)
            write_shape_gguf(shape, target, tokenizer_from, seed=args.seed, kind=kind)
        elif (kind, target) in todo:
            print(f"quantizing to {kind}: {target}", file=sys.stderr)
            assert binary is not None
            quantize(binary, f16, target, kind)
        yield target
    if args.drop_f16 and f16.exists():
        f16.unlink()


def _smollm2() -> Path:
    from surge.models.formats.resolve import resolve_model

    return Path(resolve_model("smollm2-135m"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", nargs="?", choices=sorted(SHAPES), help="the model's shapes")
    parser.add_argument("--list", action="store_true", help="print the shapes and exit")
    parser.add_argument("--layers", type=int, help="override the number of layers (a quick run)")
    parser.add_argument("--vocab", type=int, help="override the vocabulary")
    parser.add_argument("--out-dir", default="~/.cache/surge/shapes", help="where the files go")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--tokenizer-from", help="GGUF whose tokenizer to copy (SmolLM2-135M's)")
    parser.add_argument("--quantize", help="llama-quantize binary (default: bench_llamacpp.sh's)")
    parser.add_argument(
        "--types", default=DEFAULT_TYPES, help="e.g. Q4_K_M,Q4_0 (llama-quantize's names)"
    )
    parser.add_argument("--no-quantize", action="store_true", help="write the F16 file only")
    parser.add_argument("--direct", action="store_true",
                        help="Q4_0/Q4_1/Q8_0 by gguf.quants, no llama-quantize")  # fmt: skip
    parser.add_argument("--drop-f16", action="store_true", help="delete the F16 file at the end")
    parser.add_argument("--force", action="store_true", help="write files that exist again")
    args = parser.parse_args(argv)
    if args.list:
        for name, shape in SHAPES.items():
            print(f"{name:14} {shape.arch:6} {shape.params / 1e9:6.2f}B  hidden {shape.hidden}, "
                  f"{shape.layers} layers, heads {shape.heads}/{shape.kv_heads}, FFN {shape.ffn}, "
                  f"vocab {shape.vocab}, {'tied' if shape.tied else 'untied'}")  # fmt: skip
        return
    if args.shape is None:
        parser.error("name a shape (--list shows them)")
    for path in _iter_outputs(args):
        print(describe(path))


if __name__ == "__main__":
    main()
