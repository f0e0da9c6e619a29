"""Weights from an HF model folder: *.safetensors, possibly sharded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from surge.models.formats.safetensors_index import safetensors_files
from surge.models.formats.spec import ModelSpec


def safetensors_weights(folder: Path, spec: ModelSpec) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 CPU tensor) for every parameter, one tensor at a time."""
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                if name.endswith("rotary_emb.inv_freq"):
                    continue  # a buffer older checkpoints saved; recomputed from the spec
                if spec.tie_word_embeddings and name == "lm_head.weight":
                    continue  # tied: the embedding serves as the output projection
                tensor = f.get_tensor(name).to(torch.float32)
                if spec.architecture == "gemma3":
                    name, tensor = gemma3_weight(name, tensor)
                yield name, tensor


# Gemma's names for its norms, and the names the model uses (Llama's where Llama has them).
_GEMMA3_NORMS = {
    "post_attention_layernorm": "post_attn_norm",  # on the attention's output
    "pre_feedforward_layernorm": "post_attention_layernorm",  # Llama's name for the MLP's input
    "post_feedforward_layernorm": "post_mlp_norm",
}


def gemma3_weight(name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
    """A Gemma 3 checkpoint's tensor as the model takes it: its norms scale by (1 + w), so the
    1 is added here (as llama.cpp does when it writes a GGUF)."""
    name = name.removeprefix("language_model.")
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in _GEMMA3_NORMS:
        parts[-2] = _GEMMA3_NORMS[parts[-2]]
    if parts[-2:-1] and parts[-2].endswith("norm") and parts[-1] == "weight":
        tensor = tensor + 1.0
    return ".".join(parts), tensor
