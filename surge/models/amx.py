"""The int8 GEMM's engine: AVX-512 VNNI, or the AMX matrix engine where a CPU has it and it
measures faster.

The packed W8A8 GEMM (kernels/w8a8_gemm.h) serves every int8 projection of more than a few
rows: prefill chunks and large decode batches, in the fused 4-bit stack and layer by layer.
On Intel Xeons of the 4th generation on (AMX-TILE, AMX-INT8) the same products run on AMX
tiles (kernels/amx_gemm.h): the same int32 sums and the same epilogue, so the same bits; only
the time differs. Which is faster depends on the number of rows (a tile is 16 rows, and the
epilogue's share grows as the products shrink), so at model load the two are timed on the
model's own first-layer projections at 8 to 512 rows, alternating, and AMX takes the steps
from the smallest row count where it wins at that count and every larger one.

The fused stack's prefill attention tiles (kernels/prefill_attention_amx.h) take their two
products (scores and values) on AMX-BF16 tiles where the CPU has them: not measured at load,
since the tiles' sums round (in their last bits) unlike the AVX-512 BF16 ones, and a process's
numbers should not hang on a timing; BENCHMARKS.md has the measured gain.

SURGE_AMX (environment):
    auto     (default) the int8 GEMM measured where the hardware passes its self-check, else
             VNNI only; the attention on AMX where the CPU has AMX-BF16 (and its self-check
             passes as the stack's module loads)
    off      VNNI and AVX-512 BF16 only
    on       the int8 GEMM on AMX from 16 rows without measuring (where the self-check passes);
             the attention as auto
    emulate  AMX's kernels with the tile operations in plain C++: tests of the kernels'
             indexing on CPUs without AMX (slow)
The choice is process-wide (every kernel module), and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from surge.config.settings import settings
from surge.models import kernels
from surge.models.device import cpu_flags
from surge.models.kernels import load_w8a8_linear
from surge.models.quant import Int8Linear

log = logging.getLogger(__name__)

MODES = ("auto", "off", "on", "emulate")
_ENGINES = {"off": 0, "hardware": 1, "emulated": 2}
# The row counts timed: a tile is 16 rows, but fewer (padded) can still win (a cached prefix's
# step of ~12 rows: 0.13 against 0.21 ms for the first layer's projections on a Xeon).
ROWS = (8, 10, 12, 16, 32, 64, 128, 256, 512)
MIN_GAIN = 1.05  # AMX must be this much faster at a row count to take it (timing noise)


@dataclass(frozen=True)
class AmxChoice:
    engine: str  # "off", "hardware" or "emulated"
    min_rows: int  # steps of this many rows or more take AMX (engine not off)
    reason: str  # with the measured times where it measured
    attention: str = "off"  # the prefill attention tiles' engine: "off", "hardware", "emulated"

    def describe(self) -> str:
        if self.engine == "off":
            gemm = f"int8 GEMM on AVX-512 VNNI ({self.reason})"
        else:
            rows = f"from {self.min_rows} rows"
            gemm = f"int8 GEMM on AMX tiles ({self.engine}) {rows} ({self.reason})"
        if self.attention == "off":
            return gemm
        return f"{gemm}; prefill attention on AMX tiles ({self.attention})"


def crossover(
    timings: Sequence[tuple[int, float, float]], min_gain: float = MIN_GAIN
) -> int | None:
    """The fewest rows from which AMX wins at every measured count: (rows, VNNI s, AMX s) in
    increasing rows -> rows, or None where it does not win at the largest."""
    best: int | None = None
    for rows, vnni, amx in reversed(timings):
        if vnni < amx * min_gain:
            break
        best = rows
    return best


def hardware_ok() -> bool:
    """The CPU has AMX, Linux grants this process the tile state, and the self-check passed."""
    module = load_w8a8_linear()
    return module is not None and bool(module.amx_hardware_ok())


def calls() -> int:
    """Thread-calls of the AMX kernel so far, both modules together (0 where it never ran)."""
    return sum(int(m.amx_calls()) for m in kernels.amx_modules())


def set_engine(engine: str, min_rows: int = 16) -> bool:
    """Sets the engine in every kernel module, loaded or to come; False where the hardware is
    asked for and absent (nothing changed then)."""
    return kernels.set_amx(_ENGINES[engine], max(1, min_rows))


def _projections(model: nn.Module) -> list[Int8Linear]:
    """The packed int8 layers of the model's first decoder layer (q4 layers' int8 copies among
    them: modules() yields those as children)."""
    layers = getattr(model, "layers", None)
    if not layers:
        return []
    return [
        m
        for m in layers[0].modules()
        if isinstance(m, Int8Linear) and m.packed and m.in_features % 64 == 0
    ]


def measure(
    projections: Sequence[Int8Linear], rows: Sequence[int] = ROWS, rounds: int = 3
) -> tuple[tuple[int, float, float], ...]:
    """(rows, VNNI s, AMX s) of the projections together, best of `rounds` alternating passes."""
    module = load_w8a8_linear()
    assert module is not None
    out = []
    gen = torch.Generator().manual_seed(0)
    for m in rows:
        xs = [torch.randn(m, p.in_features, generator=gen) for p in projections]
        best = {0: float("inf"), 1: float("inf")}
        for _ in range(rounds + 1):  # the first pass warms up
            for engine in (0, 1):
                if not module.set_amx(engine, 1):
                    raise RuntimeError("AMX tiles unavailable here: nothing to measure")
                t = time.perf_counter()
                for p, x in zip(projections, xs, strict=True):
                    p(x)
                best[engine] = min(best[engine], time.perf_counter() - t)
        out.append((m, best[0], best[1]))
    module.set_amx(0, 1)
    return tuple(out)


def configure(model: nn.Module, mode: str | None = None) -> AmxChoice:
    """Chooses and sets the engine for `model`'s int8 projections ($SURGE_AMX by default)."""
    mode = mode or settings().amx
    if mode not in MODES:
        raise ValueError(f"SURGE_AMX={mode!r}: one of {', '.join(MODES)}")
    choice = _choose(model, mode)
    set_engine(choice.engine, choice.min_rows)
    attention = _attention_engine(mode)
    if not kernels.set_amx_attention(_ENGINES[attention]):  # its module loaded, self-check failed
        attention = "off"
    choice = replace(choice, attention=attention)
    on = choice.engine != "off" or attention != "off"
    (log.info if on or mode != "auto" else log.debug)(choice.describe())
    return choice


def _attention_engine(mode: str) -> str:
    if mode == "off":
        return "off"
    if mode == "emulate":
        return "emulated"
    return "hardware" if {"amx_tile", "amx_bf16"} <= cpu_flags() else "off"


def _choose(model: nn.Module, mode: str) -> AmxChoice:
    if mode == "off":
        return AmxChoice("off", 0, "SURGE_AMX=off")
    if not kernels.amx_modules():
        return AmxChoice("off", 0, "no compiled kernels")
    if mode == "emulate":
        return AmxChoice("emulated", 16, "SURGE_AMX=emulate")
    if not hardware_ok():
        return AmxChoice("off", 0, "no usable AMX on this CPU")
    if mode == "on":
        return AmxChoice("hardware", 16, "SURGE_AMX=on")
    projections = _projections(model)
    if not projections:
        return AmxChoice("off", 0, "no packed int8 layers to run on it")
    timings = measure(projections)
    from_rows = crossover(timings)
    summary = ", ".join(f"{m}: {v * 1e3:.2f}/{a * 1e3:.2f} ms" for m, v, a in timings)
    if from_rows is None:
        return AmxChoice("off", 0, f"AMX measured slower, VNNI/AMX {summary}")
    return AmxChoice("hardware", from_rows, f"measured, VNNI/AMX {summary}")
