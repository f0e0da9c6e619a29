"""Build a compiled kernel's source as it was at another git revision, under the op namespace
`surge_old`, so a benchmark can run old and new side by side in one process (this machine
drifts between runs, so only interleaved comparisons mean anything)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

from torch.utils.cpp_extension import load

KERNELS = Path("surge/models/kernels")


def _show(rev: str, path: Path) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def build_old(name: str, rev: str) -> ModuleType:
    """Registers torch.ops.surge_old.* from KERNELS/<name>.cpp at `rev`, with the headers as
    they were at `rev` (those that did not exist yet come from the working tree); returns the
    module (its pybind functions, e.g. set_amx)."""
    src = _show(rev, KERNELS / f"{name}.cpp")
    for kind in ("TORCH_LIBRARY_FRAGMENT(surge,", "TORCH_LIBRARY_IMPL(surge,"):
        src = src.replace(kind, kind.replace("(surge,", "(surge_old,"))
    build = Path(tempfile.mkdtemp(prefix="surge-old-kernel-"))
    path = build / f"{name}_old.cpp"
    path.write_text(src)
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, f"{KERNELS}/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for header in (Path(h) for h in listed if h.endswith(".h")):
        # Beside the source: a quoted #include finds these before the include path.
        (build / header.name).write_text(_show(rev, header))
    return load(
        name=f"surge_{name}_old",
        sources=[str(path)],
        # Hidden symbols: the header templates both builds instantiate must not resolve to the
        # other library's copy when both are loaded in one process.
        extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fvisibility=hidden"],
        extra_ldflags=["-fopenmp"],
        extra_include_paths=[str(KERNELS.resolve())],
        build_directory=str(build),
    )
