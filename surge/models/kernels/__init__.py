"""Optional compiled CPU kernels, built on first use with torch's C++ extension loader.

If the build fails (no compiler, no ninja), callers fall back to the pure-torch path: the
kernels are a speed-up, never a requirement.

SURGE_KERNEL_TIER=avx512|avx2|scalar builds them for a lower instruction-set tier than this CPU's
(cpu_features.h), in a build folder of its own, so the paths of CPUs without AVX-512 (or without
any SIMD) run and are tested on an AVX-512 machine (`make test-kernel-tiers`). One tier a process:
the modules register the same torch ops.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from surge.config.settings import settings

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
_cache: dict[str, ModuleType | None] = {}
# The int8 GEMM's engine and its fewest rows (set_amx's arguments; surge/models/amx.py chooses
# them), applied to every module that has one as it loads: a module loaded after the choice
# (the fused stack's, built later than the model) gets it too.
_amx_setting: tuple[int, int] = (0, 16)
# The prefill attention tiles' engine (set_amx_attention's argument), applied the same way.
_amx_attention_setting = 0
# Every kernel module, by its source's name (`python -m surge.models.kernels` builds them all).
KERNELS = (
    "paged_decode",
    "int8_linear",
    "q4_linear",
    "q4_decode",
    "w8a8_linear",
    "token_mask",
    "gguf_blocks",
)
# GGML type id -> (weights, bytes) of one block, for the formats gguf_blocks.cpp runs as stored
# (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K).
GGUF_BLOCKS = {
    2: (32, 18),
    3: (32, 20),
    8: (32, 34),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
}
# The -march of each tier (cpu_features.h works the tier out from the macros these set): native
# is this CPU's own; the others are the x86-64 levels below AVX-512 VNNI.
TIER_FLAGS = {
    "native": "-march=native",
    "avx512": "-march=skylake-avx512",  # AVX-512 F/BW/VL without VNNI
    "avx2": "-march=x86-64-v3",  # AVX2, FMA, F16C
    "scalar": "-march=x86-64",  # SSE2 only: the plain loops
}


# What a CPU needs to run a tier's code (/proc/cpuinfo's names); a tier it lacks cannot even be
# loaded (its module's code dies with SIGILL), so it is neither built nor tested there.
TIER_NEEDS = {
    "native": frozenset(),
    "avx512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "scalar": frozenset(),
}


def tier_runs_here(tier: str) -> bool:
    from surge.models.device import cpu_flags

    return TIER_NEEDS[tier] <= cpu_flags()


def kernel_tier() -> str:
    """The tier to build for: $SURGE_KERNEL_TIER, else native."""
    tier = settings().kernel_tier
    if tier not in TIER_FLAGS:
        raise ValueError(f"SURGE_KERNEL_TIER={tier!r}: expected one of {', '.join(TIER_FLAGS)}")
    return tier


def _build_tag(sources: Path = _HERE, torch_dir: Path | None = None) -> str:
    """A short name for this CPU's instruction set, where the sources live and which torch
    builds them. The kernels are built with -march=native, so a build folder shared by machines
    of different CPUs (one home over NFS, a cache copied to a new machine) must not hand one
    CPU's binary to another (illegal instruction). And ninja records each source and torch's
    headers by their paths: two installs sharing the folder (a checkout and a clone of it, one
    checkout run from two venvs) rebuilt each other's kernels at every switch, all of them (~2
    min on 2 cores)."""
    import torch

    from surge.models.device import cpu_flags

    torch_dir = torch_dir or Path(torch.__file__).parent  # as the build sees it: not resolved
    key = " ".join(
        [platform.machine(), *sorted(cpu_flags()), str(sources.resolve()), str(torch_dir)]
    )
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def kernel_dir() -> Path:
    """Where the kernels are built: $SURGE_KERNEL_DIR, else ~/.cache/surge/kernels, in a
    folder per CPU and install (_build_tag), and per tier below native (kernel_tier)."""
    root = settings().kernel_dir
    tier = kernel_tier()
    return root / (_build_tag() if tier == "native" else f"{_build_tag()}-{tier}")


def _use_pinned_ninja() -> None:
    """Put the environment's own ninja (pinned in pyproject) first on PATH: torch's loader runs
    whichever `ninja` PATH finds, and a build recorded by another ninja version (a system one,
    when the venv is not activated) is a log the other cannot read, so it rebuilds every kernel
    (minutes on 2 cores); without a system ninja nothing would build at all."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if (Path(bin_dir) / "ninja").exists() and path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = os.pathsep.join([bin_dir, path]) if path else bin_dir


@contextmanager
def _build_lock(build: Path) -> Iterator[None]:
    """One builder of a kernel at a time, by an flock the kernel releases when its holder dies.
    torch's loader locks with a file it creates and deletes (`lock` in the build folder): a
    build killed midway (a test's timeout, Ctrl-C) left it behind, and every later start waited
    on it forever. Under this flock no other builder of ours is running, so one found there is
    stale: removed."""
    with open(build.parent / f"{build.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released on close, or when the process dies
        stale = build / "lock"
        if stale.exists():
            log.warning("removing a stale build lock left by a killed build: %s", stale)
            stale.unlink(missing_ok=True)
        yield


def _load(name: str, build_dir: Path | None) -> ModuleType | None:
    if name in _cache:
        return _cache[name]
    module: ModuleType | None = None
    t0 = time.perf_counter()
    try:
        _use_pinned_ninja()
        from torch.utils.cpp_extension import load

        # One folder per kernel: the loader writes its build.ninja there.
        build = (build_dir or kernel_dir()) / name
        build.mkdir(parents=True, exist_ok=True)
        with _build_lock(build):
            module = load(
                name=f"surge_{name}",
                sources=[str(_HERE / f"{name}.cpp")],
                extra_cflags=["-O3", TIER_FLAGS[kernel_tier()], "-ffast-math", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(build),
                verbose=settings().verbose_build,
            )
    except Exception as e:  # any build problem: use the torch fallback
        log.warning("compiled kernel %s unavailable, using torch ops: %s", name, e)
    _cache[name] = module
    if module is not None and hasattr(module, "set_amx"):
        module.set_amx(*_amx_setting)
    attention = getattr(module, "set_amx_attention", None)
    if attention is not None and not attention(_amx_attention_setting):
        log.warning("AMX prefill attention failed its self-check: AVX-512 BF16 tiles instead")
    if module is not None:
        _register_fakes()
        took = time.perf_counter() - t0
        if took > 2.0:  # a build, not a load: say so, or it reads as the model's load time
            log.info("compiled kernel %s built in %.1f s (kept in %s)", name, took, build.parent)
    return module


def amx_modules() -> list[ModuleType]:
    """The loaded modules that hold an int8 GEMM engine (amx_gemm.h), the packed GEMM's first:
    loading it is how a process learns whether it has the kernels at all."""
    loaded = [load_w8a8_linear()] + [m for n, m in _cache.items() if n != "w8a8_linear"]
    return [m for m in loaded if m is not None and hasattr(m, "set_amx")]


def set_amx(mode: int, min_rows: int) -> bool:
    """The int8 GEMM's engine (0 VNNI, 1 AMX, 2 AMX emulated) from `min_rows` rows, in every
    loaded module and in those loaded later; False (nothing changed) where a module refuses it
    (the hardware asked for where it fails its self-check)."""
    global _amx_setting
    modules = amx_modules()
    if not modules:
        return mode == 0
    if mode == 1 and not modules[0].amx_hardware_ok():
        return False
    _amx_setting = (mode, min_rows)
    return all([m.set_amx(mode, min_rows) for m in modules])


def set_amx_attention(mode: int) -> bool:
    """The fused stack's prefill attention tiles' engine (0 AVX-512 BF16, 1 AMX, 2 AMX emulated)
    in its module, now where it is loaded, else as it loads (not built for this: a model that
    never runs the stack never pays its build). False where the loaded module refuses it (the
    hardware asked for where it fails its self-check; nothing changed then)."""
    global _amx_attention_setting
    module = _cache.get("q4_decode")
    if module is not None and not module.set_amx_attention(mode):
        return False
    _amx_attention_setting = mode
    return True


def load_paged_decode(build_dir: Path | None = None) -> ModuleType | None:
    """The compiled paged-decode module, or None when it cannot be built here."""
    return _load("paged_decode", build_dir)


def load_int8_linear(build_dir: Path | None = None) -> ModuleType | None:
    """The compiled int8 linear helpers (GEMV, row quantization, int32 dequant), or None."""
    return _load("int8_linear", build_dir)


def load_q4_linear(build_dir: Path | None = None) -> ModuleType | None:
    """The compiled 4-bit block GEMV (surge::q4_gemv), or None."""
    return _load("q4_linear", build_dir)


def load_w8a8_linear(build_dir: Path | None = None) -> ModuleType | None:
    """The prepacked W8A8 GEMM (surge::w8a8_linear; `supported` is False without AVX-512
    VNNI), or None."""
    return _load("w8a8_linear", build_dir)


def load_q4_decode(build_dir: Path | None = None) -> ModuleType | None:
    """The fused 4-bit decode stack (class Q4DecodeStack; `supported` is False without
    AVX-512 VNNI), or None."""
    return _load("q4_decode", build_dir)


def load_gguf_blocks(build_dir: Path | None = None) -> ModuleType | None:
    """GGUF's own quantized blocks as stored (surge::gguf_dequantize, surge::gguf_linear), or
    None."""
    return _load("gguf_blocks", build_dir)


def load_token_mask(build_dir: Path | None = None) -> ModuleType | None:
    """surge::apply_token_bitmask_ (structured output's logit masks), or None."""
    return _load("token_mask", build_dir)


def _register_fakes() -> None:
    """Shape-only versions of the ops, so torch.compile can trace a graph through them."""
    import torch

    def fake_int8_gemv(
        x: torch.Tensor, w: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return x.new_empty((x.shape[0], w.shape[0]))

    def fake_q4_gemv(
        x: torch.Tensor, qs: torch.Tensor, dm: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return x.new_empty((x.shape[0], qs.shape[0]))

    def fake_w8a8_linear(
        x: torch.Tensor,
        packed: torch.Tensor,
        scale: torch.Tensor,
        wsum: torch.Tensor,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        return x.new_empty((x.shape[0], scale.shape[0]), dtype=out_dtype or x.dtype)

    def fake_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = x.shape[0]
        return (
            x.new_empty(x.shape, dtype=torch.int8),
            x.new_empty(rows, dtype=torch.float32),
            x.new_empty(rows, dtype=torch.int32),
        )

    def fake_dequantize_int32(
        acc: torch.Tensor,
        sx: torch.Tensor,
        zx: torch.Tensor,
        sw: torch.Tensor,
        wsum: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        return acc.new_empty(acc.shape, dtype=dtype)

    def fake_paged_decode(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        return torch.empty_like(q)

    def fake_gguf_dequantize(blocks: torch.Tensor, type: int) -> torch.Tensor:
        weights, size = GGUF_BLOCKS[type]
        return blocks.new_empty(
            (blocks.shape[0], blocks.shape[1] // size * weights), dtype=torch.float32
        )

    def fake_gguf_linear(
        x: torch.Tensor, blocks: torch.Tensor, type: int, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return x.new_empty((x.shape[0], blocks.shape[0]))

    def fake_gguf_linear_parts(
        x: torch.Tensor, parts: list[torch.Tensor], types: list[int], bias: torch.Tensor | None
    ) -> torch.Tensor:
        return x.new_empty((x.shape[0], sum(p.shape[0] for p in parts)))

    fakes = {
        "surge::int8_gemv": fake_int8_gemv,
        "surge::q4_gemv": fake_q4_gemv,
        "surge::w8a8_linear": fake_w8a8_linear,
        "surge::quantize_rows": fake_quantize_rows,
        "surge::dequantize_int32": fake_dequantize_int32,
        "surge::paged_decode": fake_paged_decode,
        "surge::gguf_dequantize": fake_gguf_dequantize,
        "surge::gguf_linear": fake_gguf_linear,
        "surge::gguf_linear_parts": fake_gguf_linear_parts,
    }
    for name, fn in fakes.items():
        if hasattr(torch.ops.surge, name.split("::")[1]) and name not in _faked:
            torch.library.register_fake(name)(fn)
            _faked.add(name)


_faked: set[str] = set()
