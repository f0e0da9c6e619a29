"""Build a compiled kernel's source as it was at another git revision, under the op namespace
`surge_old`, so a benchmark can run old and new side by side in one process (this machine
drifts between runs, so only interleaved comparisons mean anything)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from torch.utils.cpp_extension import load

KERNELS = Path("surge/models/kernels")


def build_old(name: str, rev: str) -> None:
    """Registers torch.ops.surge_old.* from KERNELS/<name>.cpp at `rev`; headers come from the
    working tree."""
    src = subprocess.run(
        ["git", "show", f"{rev}:{KERNELS / name}.cpp"], check=True, capture_output=True, text=True
    ).stdout
    for kind in ("TORCH_LIBRARY_FRAGMENT(surge,", "TORCH_LIBRARY_IMPL(surge,"):
        src = src.replace(kind, kind.replace("(surge,", "(surge_old,"))
    build = Path(tempfile.mkdtemp(prefix="surge-old-kernel-"))
    path = build / f"{name}_old.cpp"
    path.write_text(src)
    load(
        name=f"surge_{name}_old",
        sources=[str(path)],
        extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        extra_include_paths=[str(KERNELS.resolve())],
        build_directory=str(build),
    )
