"""Open a model on disk (a GGUF file or an HF folder): its spec and tokenizer without torch;
its weights, as tensors, only when `weights()` is called (in the engine process)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Import the class, not the module: the package surge.models.weights.gguf would shadow `gguf`.
from surge.models.formats.gguf_file import GGUFFile, GGUFSource
from surge.models.formats.safetensors_index import safetensors_files
from surge.models.formats.spec import ModelSpec
from surge.models.formats.tokenizer import Tokenizer

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["ModelFiles", "open_model"]


@dataclass(frozen=True)
class ModelFiles:
    path: Path
    spec: ModelSpec
    tokenizer: Tokenizer
    _load: Callable[[], Iterator[tuple[str, Tensor]]] = field(repr=False, compare=False)
    # A GGUF's storage type of every layer matrix ("Q4_1", ...; "mixed" quantized types); None
    # for safetensors or mixed float types.
    layer_format: str | None = None
    # (HF name, tensor or matrix source over the file's blocks): what the streaming build reads
    # (surge/models/stream_load.py); None: weights() serves it.
    _sources: Callable[[], Iterator[tuple[str, Any]]] | None = field(
        default=None, repr=False, compare=False
    )
    _kinds: Callable[[], dict[str, str]] | None = field(default=None, repr=False, compare=False)
    tensor_bytes: int = 0  # the weights' bytes in the file(s)

    def weights(self) -> Iterator[tuple[str, Tensor]]:
        """(HF parameter name, float32 CPU tensor [out_features, in_features]) pairs, read
        lazily one at a time so peak memory stays near one tensor."""
        return self._load()

    def matrix_kinds(self) -> dict[str, str] | None:
        """HF name -> GGML type name ("Q4_0", "F16"...) of each matrix of a GGUF; None for
        safetensors (all float). Engine side: it imports torch."""
        return self._kinds() if self._kinds is not None else None

    def sources(self) -> Iterator[tuple[str, Any]]:
        """As weights(), but matrices of a GGUF as sources over its blocks, unconverted."""
        return self._sources() if self._sources is not None else self._load()


def open_model(path: str | Path) -> ModelFiles:
    """Open a .gguf file, or an HF folder with config.json, *.safetensors and tokenizer.json."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) != 1:
            raise ValueError(
                f"{path} is not a model folder: expected config.json + *.safetensors, "
                f"or exactly one .gguf file (found {len(ggufs)})"
            )
        path = ggufs[0]
    if path.is_dir():
        return _open_hf_folder(path)
    if path.suffix != ".gguf":
        raise ValueError(f"{path} is not a .gguf file or a model folder")
    return _open_gguf(path)


def _open_gguf(path: Path) -> ModelFiles:
    reader = GGUFFile(path)  # memory-mapped: tensors are read when weights() runs
    spec = ModelSpec.from_gguf(reader)
    return ModelFiles(
        path=path,
        spec=spec,
        tokenizer=Tokenizer.from_gguf(reader),
        _load=lambda: _gguf_weights(reader, spec),
        layer_format=layer_block_format(reader),
        _sources=lambda: _gguf_sources(reader, spec),
        _kinds=lambda: _gguf_kinds(reader),
        tensor_bytes=sum(int(t.n_bytes) for t in reader.tensors),
    )


def _open_hf_folder(path: Path) -> ModelFiles:
    with (path / "config.json").open(encoding="utf-8") as f:
        spec = ModelSpec.from_hf_config(json.load(f))
    safetensors_files(path)  # fail now, not on first weights() call, if shards are missing
    return ModelFiles(
        path=path,
        spec=spec,
        tokenizer=Tokenizer.from_hf_folder(path),
        _load=lambda: _safetensors_weights(path, spec),
        tensor_bytes=sum(f.stat().st_size for f in safetensors_files(path)),
    )


def _gguf_weights(reader: GGUFFile, spec: ModelSpec) -> Iterator[tuple[str, Tensor]]:
    from surge.models.weights.gguf import gguf_weights  # torch: the engine process only

    return gguf_weights(reader, spec)


def _gguf_sources(reader: GGUFFile, spec: ModelSpec) -> Iterator[tuple[str, Any]]:
    from surge.models.weights.gguf import gguf_sources

    return gguf_sources(reader, spec)


def _gguf_kinds(reader: GGUFFile) -> dict[str, str]:
    from surge.models.weights.gguf import file_kinds

    return file_kinds(reader)


def _safetensors_weights(path: Path, spec: ModelSpec) -> Iterator[tuple[str, Tensor]]:
    from surge.models.weights.safetensors import safetensors_weights

    return safetensors_weights(path, spec)


def layer_block_format(reader: GGUFSource) -> str | None:
    """The one GGUF type every decoder layer's matrix is stored in ("Q4_1", "F16", ...);
    "mixed" when they differ and some are quantized (K-quant files: Q4_K, Q6_K...), None when
    they are floats of different types (norms, 1-D, are not counted)."""
    kinds = {
        t.tensor_type.name
        for t in reader.tensors
        if t.name.startswith("blk.") and len(t.shape) == 2
    }
    if len(kinds) == 1:
        return kinds.pop()
    return "mixed" if any(k.startswith(("Q", "IQ")) for k in kinds) else None
