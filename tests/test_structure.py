"""The shape of the code base: small files, and imports that flow one way (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 500

# package -> packages of surge it must never import
FORBIDDEN = {
    "surge.models": ("surge.engine", "surge.server", "surge.observability"),
    "surge.engine": ("surge.server",),
    "surge.observability": ("surge.server", "surge.gateway", "surge.bench"),
    # The autoscaler talks to replicas and the gateway over HTTP and files, and starts them
    # as processes: it imports none of them.
    "surge.autoscale": (
        "surge.models",
        "surge.engine",
        "surge.server",
        "surge.gateway",
        "surge.bench",
        "surge.batching",
    ),
    # The batcher is generic: it is handed a batch function, and knows no model or server.
    "surge.batching": (
        "surge.models",
        "surge.engine",
        "surge.server",
        "surge.gateway",
        "surge.bench",
    ),
    # The fleet simulator drives the autoscaler's decision code with surge bench's traffic
    # models (both imported, neither copied); it runs no model and no server.
    "surge.fleetsim": ("surge.models", "surge.engine", "surge.server", "surge.gateway"),
    # The gateway talks to servers over HTTP only; the bench is a client of any OpenAI server.
    "surge.gateway": ("surge.models", "surge.engine", "surge.server", "surge.bench"),
    "surge.bench": (
        "surge.models",
        "surge.engine",
        "surge.server",
        "surge.gateway",
        "surge.observability",
    ),
}

# Modules that must not import torch, not even through the surge modules they import: the
# scheduler describes each step as plain data (the sampler's row is engine/sampling_row.py).
NO_TORCH = ("surge.engine.scheduler", "surge.engine.sampling_row", "surge.sampling_params")


def _python_files() -> list[Path]:
    return [p for d in ("surge", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]


def test_no_file_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these files: {long}"


def test_imports_flow_one_way() -> None:
    bad = []
    for path in (ROOT / "surge").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for package, forbidden in FORBIDDEN.items():
            if not module.startswith(package):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                bad += [f"{module} imports {n}" for n in names if n.startswith(forbidden)]
    assert not bad, bad


def _module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported_at_load(module: str) -> list[str]:
    """What importing `module` imports (its module-level imports, not those under `if
    TYPE_CHECKING` or inside functions), with the packages above each."""
    path = _module_file(module)
    if path is None:
        return []
    names: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            # `from surge.engine import sampler` imports the module surge.engine.sampler
            names += [f"{node.module}.{a.name}" for a in node.names]
    parents = [".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 1)]
    return names + parents


def test_plain_modules_do_not_import_torch() -> None:
    bad = []
    for start in NO_TORCH:
        seen, todo = {start}, [start]
        while todo:
            module = todo.pop()
            for name in _imported_at_load(module):
                if name == "torch" or name.startswith("torch."):
                    bad.append(f"{start} imports torch through {module}")
                elif name.startswith("surge") and name not in seen and _module_file(name):
                    seen.add(name)
                    todo.append(name)
    assert not bad, bad
