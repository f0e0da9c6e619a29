"""Debian's `prometheus` package (prometheus, promtool) for the tests that run them: found on
PATH, else installed the way `make system-deps` does when this is a root Debian machine; a test
skips, saying why, only when it is absent and cannot be installed here."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest

ROOT_ONLY = "apt-get needs root"


@functools.cache
def _install() -> str | None:
    """None once installed, else why not."""
    if shutil.which("apt-get") is None:
        return "not a Debian machine (no apt-get)"
    if os.geteuid() != 0:
        return ROOT_ONLY
    for cmd in (["apt-get", "update"],
                ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"]):  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            return f"{' '.join(cmd)} failed: {done.stderr[-500:]}"
    return None


def binary(name: str) -> str:
    """The path of `name` (promtool or prometheus), installing the package when missing."""
    path = shutil.which(name)
    if path is None:
        why = _install()
        path = shutil.which(name)
        if path is None:
            pytest.skip(f"{name} is not installed and cannot be installed here ({why}); "
                        "`make system-deps` installs Debian's prometheus package")  # fmt: skip
    return path
