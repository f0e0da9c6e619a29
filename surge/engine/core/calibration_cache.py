"""The start-up step costs (engine/core/calibrate.py), kept per model, configuration and machine.

Measuring them costs seconds at every start (2.7 s of SmolLM2's ~5 s on 2 cores), and a
replica that the autoscaler starts again on the same machine would measure the same thing.
So the measurement is stored under a key of everything that sets a step's cost: the model
file (path, size, modification time), the engine configuration, the precision and KV plan the
engine chose, the CPU (model name, flags, cores, torch threads), the device, the torch version,
the kernel tier and the engine's and models' source code. A changed flag, model, machine,
release or edit measures again.
The live steps refit the cost model anyway (engine/client/step_cost.py), so a stored measurement
that was taken under other load is corrected by the first minutes of traffic.

Kept in $SURGE_CALIBRATION_DIR, else ~/.cache/surge/calibration; a directory that cannot be
written only means measuring at every start (logged once per start, never fatal).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path

import torch

from surge.config.settings import settings
from surge.engine.client.step_cost import StepSample
from surge.engine.core.engine_core import EngineCore

log = logging.getLogger(__name__)

VERSION = 2  # of what calibrate() measures: raise it when the shapes it runs change


def cache_dir() -> Path:
    return settings().calibration_dir


def _source_digest() -> str:
    """The engine's and models' code (Python and kernels): an edit changes step costs."""
    root = Path(__file__).resolve().parents[2]  # surge/ (this file is surge/engine/core/...)
    h = hashlib.sha256()
    for sub in ("engine", "models"):
        for f in sorted((root / sub).rglob("*")):
            if f.suffix in (".py", ".cpp", ".h") and "__pycache__" not in f.parts:
                h.update(f.relative_to(root).as_posix().encode())
                h.update(f.read_bytes())
    return h.hexdigest()


def cache_key(engine: EngineCore) -> str:
    """What a step's cost depends on, hashed."""
    from surge.models.device import cpu_flags, cpu_name
    from surge.models.kernels import kernel_tier

    path = Path(engine.files.path)
    try:
        st = path.stat()
        model = [str(path.resolve()), st.st_size, st.st_mtime_ns]
    except OSError:
        model = [str(path)]
    device = engine.precision.device
    config = dataclasses.asdict(engine.config)
    config["scheduler"].pop("calibration", None)  # how to get the costs, not what sets them
    parts = {
        "version": VERSION,
        "source": _source_digest(),
        "torch": torch.__version__,
        "model": model,
        "config": config,
        "dtype": str(engine.precision.dtype),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        "kv": [engine.plan.num_blocks, engine.plan.block_size],
        "cpu": [platform.machine(), cpu_name(), sorted(cpu_flags()), os.cpu_count()],
        "threads": torch.get_num_threads(),
        "kernel_tier": kernel_tier(),
    }
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def load(key: str) -> tuple[StepSample, ...] | None:
    """The stored samples for `key`, or None (none stored, or unreadable)."""
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text())
        samples = tuple((int(t), int(r), float(s)) for t, r, s in data["samples"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return samples if samples and all(s > 0 for _, _, s in samples) else None


def save(key: str, samples: tuple[StepSample, ...]) -> None:
    """Store `samples` for `key` (written whole, then renamed: concurrent starts never read half
    a file); a failure is logged, not raised."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
            json.dump({"samples": [list(s) for s in samples]}, f)
        os.replace(f.name, folder / f"{key}.json")
    except OSError as e:
        log.warning("step costs not kept for the next start (%s): %s", folder, e)
