"""The kernels' lower instruction-set paths, run on this machine: the kernel tests again in a
subprocess whose kernels are built for a lower tier (SURGE_KERNEL_TIER, cpu_features.h), so an
AVX-512 machine also checks the AVX2 paths and the plain loops that CPUs without it run.

Each tier's kernels are built once into a folder of their own (then cached like the native
ones; `make kernels` builds the AVX2 tier beside the native one, several at a time). Measured on
a 2-core AMD EPYC: the AVX2 tier's six kernels take 3.6 min of CPU to build (one core each), its
kernel tests ~15 s of CPU. `make test` runs the AVX2 tier (marked slow); the plain loops and the
AVX-512-without-VNNI tier run in `make test-kernel-tiers` (marked extra).
"""

from __future__ import annotations

import fcntl
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from surge.models.kernels import (
    KERNELS,
    TIER_FLAGS,
    _build_lock,
    _load,
    kernel_dir,
    kernel_tier,
    tier_runs_here,
)

ROOT = Path(__file__).resolve().parents[2]
# The kernels' correctness tests: each compares a compiled path against torch or a reference.
KERNEL_TESTS = [
    "tests/models/test_kernels.py",
    "tests/models/test_quant.py",
    "tests/models/test_q4.py",
    "tests/models/test_q4_decode.py",
    "tests/models/test_q4_decode_lora.py",
    "tests/models/test_prefill_attention.py",
    "tests/models/test_amx.py",
    "tests/models/test_gguf_linear.py",
    "tests/models/test_gguf_fused_stack.py",
    "tests/models/test_kernel_tiers.py",  # test_every_kernel_builds_for_the_tier_asked
]


def test_every_kernel_builds_for_the_tier_asked() -> None:
    """Under SURGE_KERNEL_TIER every kernel must build, for that tier: the kernel tests skip
    where a kernel is unavailable, so a lower tier that failed to build would pass unseen."""
    tier = kernel_tier()
    if tier == "native":
        pytest.skip("the native tier: the kernel tests run on what this CPU builds")
    for name in KERNELS:
        module = _load(name, None)
        assert module is not None, f"{name} did not build for SURGE_KERNEL_TIER={tier}"
        assert module.tier == tier, f"{name} built for {module.tier}, not {tier}"


def test_each_tier_builds_in_a_folder_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURGE_KERNEL_TIER", "native")
    native = kernel_dir()
    for tier in ("avx512", "avx2", "scalar"):
        monkeypatch.setenv("SURGE_KERNEL_TIER", tier)
        assert kernel_dir() == native.with_name(f"{native.name}-{tier}")
    monkeypatch.setenv("SURGE_KERNEL_TIER", "avx9000")
    with pytest.raises(ValueError, match="expected one of native"):
        kernel_dir()


def test_a_killed_build_does_not_stall_the_next(tmp_path: Path) -> None:
    """torch's loader waits forever on the `lock` file a killed build left behind; under our
    flock (which the kernel drops with its holder) no builder is running, so it is removed."""
    build = tmp_path / "paged_decode"
    build.mkdir()
    (build / "lock").touch()  # as a build killed midway leaves it
    with _build_lock(build):
        assert not (build / "lock").exists()
        # A second builder waits.
        with open(tmp_path / "paged_decode.lock", "w") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(tmp_path / "paged_decode.lock", "w") as other:  # released with its holder
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.timeout(2400)  # a cold build of a tier's six kernels on one slow core, then its tests
@pytest.mark.parametrize(
    "tier",
    [
        pytest.param("avx2", marks=pytest.mark.slow),
        pytest.param("avx512", marks=pytest.mark.extra),
        pytest.param("scalar", marks=pytest.mark.extra),
    ],
)
def test_kernel_tests_pass_on_a_lower_tier(tier: str) -> None:
    assert tier in TIER_FLAGS
    if kernel_tier() != "native":
        pytest.skip("already inside a tier's run")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the tiers are x86-64's; this is {platform.machine()}")
    if _load("paged_decode", None) is None:
        pytest.skip("no C++ toolchain: no kernel builds here, at any tier")
    if not tier_runs_here(tier):
        pytest.skip(f"this CPU cannot run the {tier} tier's code (no {tier} instructions)")
    env = {**os.environ, "SURGE_KERNEL_TIER": tier}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
    out = subprocess.run(
        [*cmd, *KERNEL_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=2300
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    assert " passed" in out.stdout and " failed" not in out.stdout
