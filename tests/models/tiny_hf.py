"""Tiny random transformers models saved as HF folders with the tiny Llama's tokenizer (SmolLM2's),
for architecture tests against transformers itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def tokenizer_vocab(tiny_model_dir: Path) -> int:
    """The vocabulary size of the tokenizer in `tiny_model_dir` (added tokens included)."""
    tok_json = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    return len(tok_json["model"]["vocab"]) + len(tok_json.get("added_tokens", []))


def save_with_tokenizer(model: Any, folder: Path, tiny_model_dir: Path) -> Path:
    """`model.save_pretrained(folder)` with the tiny Llama's tokenizer files beside it."""
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny_model_dir / name).read_bytes())
    return folder
