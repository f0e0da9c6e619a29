"""Optional compiled CPU kernels, built on first use with torch's C++ extension loader.

If the build fails (no compiler, no ninja), callers fall back to the pure-torch path: the
kernels are a speed-up, never a requirement.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
_cache: dict[str, ModuleType | None] = {}


def load_paged_decode(build_dir: Path | None = None) -> ModuleType | None:
    """The compiled paged-decode module, or None when it cannot be built here."""
    if "paged_decode" in _cache:
        return _cache["paged_decode"]
    module: ModuleType | None = None
    try:
        from torch.utils.cpp_extension import load

        build = build_dir or Path.home() / ".cache" / "surge" / "kernels"
        build.mkdir(parents=True, exist_ok=True)
        module = load(
            name="surge_paged_decode",
            sources=[str(_HERE / "paged_decode.cpp")],
            extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=bool(os.environ.get("SURGE_VERBOSE_BUILD")),
        )
    except Exception as e:  # any build problem: use the torch fallback
        log.warning("compiled paged decode unavailable, using torch ops: %s", e)
    _cache["paged_decode"] = module
    return module
