"""A model's weights in their final layout (q4 blocks repacked, int8 rows packed for the GEMM,
the file's own blocks), kept on disk after the first load and memory-mapped on later ones.

Converting a quantized GGUF into the forms Surge runs (surge/models/forms.py) costs seconds a
start (a 1B Q4_0: its Q6_K embedding dequantized and rounded to int8, its Q4_0 blocks repacked;
~20 s of a 2-core EPYC's start). The result depends only on the file, how it is loaded (the
resolved quantization, dtype, kernels on or off), the CPU (packing follows its int8 GEMM's
layout) and Surge's conversion code, so it is stored under a key of these and read back with
`torch.load(mmap=True)`: the tensors are views of the page cache, not copies (the resident
weights are the cached file's pages, shared with any other replica on the machine).

The file is identified cheaply: its size, modification time and a hash of 64 KiB samples at
33 places (start, end and between): hashing all of an 8B file's 5 GB would itself cost seconds,
and a model file is replaced (a new mtime), not edited in place under the same size and times.
The code is identified by a hash of surge/models' sources (Python and kernels): any edit there
builds the layout again. Kept in $SURGE_LAYOUT_DIR (else ~/.cache/surge/layouts; "off" disables
it), one entry per model file (a new key replaces the old one's); a directory that cannot be
written only means converting at every start.

What is stored is the loaded network's children but its rotary tables (built from the
configured context at every start): modules pickled with their tensors, so only Surge's own
cache directory is ever unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from torch import nn

from surge.config.settings import settings

log = logging.getLogger(__name__)

VERSION = 1  # of what is stored: raise it when the stored object's shape changes
SAMPLES = 33
SAMPLE_BYTES = 64 << 10
SKIPPED = frozenset({"rotary", "local_rotary"})  # built at every start from the context
MAX_ENTRIES = 4  # models kept; the oldest used goes first


def file_digest(path: Path) -> str:
    """Size, mtime and sampled bytes of a model file, hashed (the module's doc says why)."""
    st = path.stat()
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode())
    with path.open("rb") as f:
        span = max(0, st.st_size - SAMPLE_BYTES)
        for i in range(SAMPLES):
            f.seek(span * i // (SAMPLES - 1))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


@cache
def code_digest() -> str:
    """surge/models' sources (the conversion and the kernels whose layouts it packs for)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".cpp", ".h") and "__pycache__" not in f.parts:
            h.update(f.relative_to(root).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def layout_dir() -> Path | None:
    return settings().layout_dir


@dataclass(frozen=True)
class LayoutCache:
    """Where one model's layout is stored, by its key; `restore` or `store` it."""

    path: Path  # the model file
    key: str
    directory: Path

    @property
    def entry(self) -> Path:
        return self.directory / f"{_stem(self.path)}-{self.key[:24]}.pt"

    def restore(self, model: nn.Module, use_kernels: bool) -> bool:
        """Fill the meta-built `model` from the stored layout; False where none is stored (or
        it cannot be read: then it is removed, and the caller converts as before)."""
        entry = self.entry
        if not entry.is_file():
            return False
        started = time.perf_counter()
        try:
            state = torch.load(entry, map_location="cpu", mmap=True, weights_only=False)
            if state.get("key") != self.key:
                raise ValueError("the entry's key differs")
            for name, value in state["children"].items():
                setattr(model, name, value)
        except Exception as e:  # a broken cache entry must never stop a start
            log.warning("layout cache %s unreadable (%s): converting the weights again", entry, e)
            with contextlib.suppress(OSError):
                entry.unlink()
            return False
        if use_kernels:
            _load_kernels()  # what building the forms loads on its way
        with contextlib.suppress(OSError):
            os.utime(entry)  # recently used: kept longest
        log.info(
            "weights from the layout cache %s (mapped in %.2f s)",
            entry,
            time.perf_counter() - started,
        )
        return True

    def store(self, model: nn.Module) -> None:
        """Write the loaded `model`'s layout (atomically); a failure is logged, never raised."""
        started = time.perf_counter()
        children: dict[str, nn.Module | nn.Parameter] = {
            n: c for n, c in model.named_children() if n not in SKIPPED
        }
        children.update(model.named_parameters(recurse=False))
        tmp: str | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                torch.save({"key": self.key, "children": children}, f)
            os.replace(tmp, self.entry)
            tmp = None
            self._evict()
        except Exception as e:  # a full disk, an unpicklable module: no cache
            log.warning("layout cache not written (%s): the next start converts again", e)
            return
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        size = self.entry.stat().st_size
        log.info(
            "layout cache: wrote %s (%.1f MiB in %.2f s); later starts map it",
            self.entry,
            size / (1 << 20),
            time.perf_counter() - started,
        )

    def _evict(self) -> None:
        """One entry per model file, and MAX_ENTRIES in all (the least recently used go); an
        entry another start removed meanwhile is no matter."""
        mine = _stem(self.path) + "-"
        aged = []
        for p in self.directory.glob("*.pt"):
            with contextlib.suppress(OSError):
                if p != self.entry and p.name.startswith(mine):
                    p.unlink()
                else:
                    aged.append((p.stat().st_mtime, p))
        aged.sort()
        for _, old in aged[: max(0, len(aged) - MAX_ENTRIES)]:
            if old != self.entry:
                old.unlink(missing_ok=True)


def layout_cache(
    path: Path, quantization: str, dtype: torch.dtype, device: torch.device, use_kernels: bool
) -> LayoutCache | None:
    """The cache for this load, or None where there is nothing worth keeping (a float model:
    its layout is the file's) or nowhere to keep it."""
    directory = layout_dir()
    if directory is None or quantization == "none" or device.type != "cpu" or not path.is_file():
        return None
    from surge.models.device import cpu_flags, cpu_name
    from surge.models.kernels import kernel_tier

    try:
        digest = file_digest(path)
    except OSError:
        return None
    parts = {
        "version": VERSION,
        "file": [str(path.resolve()), digest],
        "code": code_digest(),
        "torch": torch.__version__,
        "load": [quantization, str(dtype), use_kernels],
        "cpu": [platform.machine(), cpu_name(), sorted(cpu_flags()), kernel_tier()],
        "amx": settings().amx,
    }
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return LayoutCache(path, key, directory)


def _stem(path: Path) -> str:
    """The entry's name prefix: the file's name and a hash of its full path (two files of one
    name in different folders are different models)."""
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return f"{path.name}-{where}"


def _load_kernels() -> None:
    from surge.models.kernels import (
        load_gguf_blocks,
        load_int8_linear,
        load_q4_linear,
        load_w8a8_linear,
    )

    for loader in (load_int8_linear, load_q4_linear, load_w8a8_linear, load_gguf_blocks):
        loader()
