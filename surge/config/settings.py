"""Every environment variable Surge reads, in one place.

The command line's flags are the way to configure a part (dataclass configs, passed down); the
environment is for what has to reach places no flag does: the kernels' build (also run as
`python -m surge.models.kernels`), the engine's child process, OpenTelemetry's standard
variables, and test-only switches. Each reader calls `settings()`, which reads the environment
afresh (cheap), so a variable set for a child process or by a test takes effect as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_CACHE = Path.home() / ".cache" / "surge"


@dataclass(frozen=True, slots=True)
class Settings:
    log_level: str  # SURGE_LOG_LEVEL: the default of --log-level, and the engine process's
    kernel_tier: str  # SURGE_KERNEL_TIER: native, or a lower instruction-set tier to build
    kernel_dir: Path  # SURGE_KERNEL_DIR: where the compiled kernels are built
    verbose_build: bool  # SURGE_VERBOSE_BUILD: print the compiler's lines
    amx: str  # SURGE_AMX: auto | on | off | emulate (the int8 GEMM's and attention's engine)
    calibration_dir: Path  # SURGE_CALIBRATION_DIR: measured step costs, per model and machine
    layout_dir: Path | None  # SURGE_LAYOUT_DIR: weights in their final layout ("off": none)
    tiled_prefill: bool  # SURGE_TILED_PREFILL=0: the fused stack's prefill row by row
    state_home: Path  # XDG_STATE_HOME: durable state (Batch API files and batches)
    # OpenTelemetry's own variables (the defaults of the tracing flags)
    otlp_traces_endpoint: str | None
    otlp_traces_protocol: str | None
    otel_service_name: str | None


def settings() -> Settings:
    env = os.environ
    return Settings(
        log_level=env.get("SURGE_LOG_LEVEL", "INFO") or "INFO",
        kernel_tier=env.get("SURGE_KERNEL_TIER", "native") or "native",
        kernel_dir=Path(env.get("SURGE_KERNEL_DIR") or _CACHE / "kernels"),
        verbose_build=bool(env.get("SURGE_VERBOSE_BUILD")),
        amx=env.get("SURGE_AMX", "auto") or "auto",
        calibration_dir=Path(env.get("SURGE_CALIBRATION_DIR") or _CACHE / "calibration"),
        layout_dir=_layout_dir(env.get("SURGE_LAYOUT_DIR")),
        tiled_prefill=env.get("SURGE_TILED_PREFILL", "1") != "0",
        state_home=Path(env.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"),
        otlp_traces_endpoint=(
            env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        )
        or None,
        otlp_traces_protocol=(
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        )
        or None,
        otel_service_name=env.get("OTEL_SERVICE_NAME") or None,
    )


def _layout_dir(value: str | None) -> Path | None:
    if value == "off":
        return None
    return Path(value) if value else _CACHE / "layouts"


def env_value(name: str) -> str | None:
    """A flag's environment fallback (a field's `flag(env=...)`, e.g. SURGE_API_KEY)."""
    return os.environ.get(name)
