"""The sampling a model's makers recommend, applied as vLLM's `--generation-config auto` does.

A Hugging Face folder's generation_config.json (Qwen3: temperature 0.6, top_p 0.95, top_k 20;
Gemma 3: top_k 64, top_p 0.95), or a GGUF's `general.sampling.*` keys (written by llama.cpp's
converter from that same file), give defaults for the fields a request leaves out: a request's
own values win, and what neither names takes the OpenAI default. `max_new_tokens` becomes the
default max_tokens. `--generation-config vllm` ignores the model's file (vLLM's name for
that), a folder reads that folder's file instead, and `--override-generation-config` (JSON)
sets fields on top of either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The fields a request can leave out, by their names in generation_config.json / in a request.
HF_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
GGUF_FIELDS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}
INT_FIELDS = ("top_k", "max_tokens")
REQUEST_FIELDS = tuple(HF_FIELDS.values())


def sampling_defaults(
    model_path: Path, setting: str = "auto", override: Mapping[str, Any] | None = None
) -> dict[str, float | int]:
    """The request fields' defaults: from the model (`auto`), none (`vllm`), or the
    generation_config.json of the folder `setting` names; then `override` (request names, or
    max_new_tokens)."""
    if setting == "auto":
        found = read_model_defaults(model_path)
    elif setting == "vllm":
        found = {}
    else:
        folder = Path(setting)
        if not (folder / "generation_config.json").is_file():
            raise ValueError(f"--generation-config: no generation_config.json in {folder}")
        found = _from_hf(folder / "generation_config.json")
    for key, value in (override or {}).items():
        name = HF_FIELDS.get(key, key)
        if name not in REQUEST_FIELDS:
            known = ", ".join(sorted({*HF_FIELDS, *REQUEST_FIELDS}))
            raise ValueError(f"--override-generation-config: {key!r} is not one of {known}")
        found[name] = _number(name, value)
    return found


def read_model_defaults(model_path: Path) -> dict[str, float | int]:
    """What the model's own files recommend ({} where they say nothing)."""
    path = Path(model_path)
    if path.is_dir():
        config = path / "generation_config.json"
        return _from_hf(config) if config.is_file() else {}
    if path.suffix == ".gguf":
        from surge.models.formats.gguf_file import GGUFFile

        gguf = GGUFFile(path)
        out: dict[str, float | int] = {}
        for key, name in GGUF_FIELDS.items():
            field = gguf.get_field(key)
            if field is not None:
                out[name] = _number(name, field.contents())
        return out
    return {}


def _from_hf(path: Path) -> dict[str, float | int]:
    config = json.loads(path.read_text())
    return {
        name: _number(name, config[key])
        for key, name in HF_FIELDS.items()
        if config.get(key) is not None
    }


def _number(name: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"generation config: {name} must be a number, got {value!r}")
    return int(value) if name in INT_FIELDS else float(value)
