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
