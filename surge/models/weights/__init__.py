"""Open a model on disk (a GGUF file or an HF folder): its spec, tokenizer and weights."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Import the class, not the module: the submodule surge.models.weights.gguf shadows the
# name `gguf` inside this package's namespace.
from surge.models.gguf_file import GGUFFile
from surge.models.spec import ModelSpec
from surge.models.tokenizer import Tokenizer
from surge.models.weights.gguf import gguf_weights, layer_block_format
from surge.models.weights.safetensors import safetensors_files, safetensors_weights

__all__ = ["ModelFiles", "open_model"]


@dataclass(frozen=True)
class ModelFiles:
    path: Path
    spec: ModelSpec
    tokenizer: Tokenizer
    _load: Callable[[], Iterator[tuple[str, torch.Tensor]]] = field(repr=False, compare=False)
    # A GGUF's storage type of every layer matrix ("Q4_1", ...; "mixed" quantized types); None
    # for safetensors or mixed float types.
    layer_format: str | None = None

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF parameter name, float32 CPU tensor [out_features, in_features]) pairs, read
        lazily one at a time so peak memory stays near one tensor."""
        return self._load()


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
        _load=lambda: gguf_weights(reader, spec),
        layer_format=layer_block_format(reader),
    )


def _open_hf_folder(path: Path) -> ModelFiles:
    with (path / "config.json").open(encoding="utf-8") as f:
        spec = ModelSpec.from_hf_config(json.load(f))
    safetensors_files(path)  # fail now, not on first weights() call, if shards are missing
    return ModelFiles(
        path=path,
        spec=spec,
        tokenizer=Tokenizer.from_hf_folder(path),
        _load=lambda: safetensors_weights(path, spec),
    )
