"""Which *.safetensors files hold an HF folder's weights (the index's shards, or all of them)."""

from __future__ import annotations

import json
from pathlib import Path

_INDEX = "model.safetensors.index.json"


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of `folder`: the shards named by the index, or every *.safetensors."""
    index = folder / _INDEX
    if index.is_file():
        with index.open(encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f).get("weight_map", {})
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise ValueError(f"{_INDEX} names missing shard files: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no *.safetensors weight files")
    return files
