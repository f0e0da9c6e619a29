"""The shape of the code base (docs/architecture.md): small files, imports that flow one way, no
import cycles between files, a light API process, every module in a package with a rule."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 500
MAX_FMT_SKIPS = 20  # `# fmt: skip` in surge/: data tables only; the formatter owns the rest

ENGINE_INSIDE = ("surge.engine.core", "surge.engine.runner", "surge.engine.sample")
NETWORKS = tuple(
    f"surge.models.{n}"
    for n in (
        "amx", "attention", "bert", "build", "device", "embedding", "evaluate", "forms",
        "kernels", "kv_quant", "layers", "llama", "lora", "q4", "q4_decode", "quant",
        "stream_load", "weights",
    )
)  # fmt: skip

# package -> packages of surge it must never import (at load time or inside a function)
FORBIDDEN = {
    "surge.models": ("surge.engine", "surge.server", "surge.observability", "surge.gateway"),
    # The files' readers run in the API process: no network code (which is torch).
    "surge.models.formats": NETWORKS,
    "surge.engine": ("surge.server", "surge.gateway", "surge.autoscale", "surge.bench"),
    # The API process's side of the engine: the core, runner and sampler are the engine
    # process's (spawn's child entry is the one exception, see EXCEPTIONS).
    "surge.engine.client": (*ENGINE_INSIDE, *NETWORKS),
    # The scheduler's side never touches tensors: the runner and the networks are below it.
    "surge.engine.core.scheduler": ("surge.engine.runner", "surge.models"),
    "surge.engine.core.policies": ("surge.engine.runner", "surge.models"),
    "surge.engine.core.block_manager": ("surge.engine.runner", "surge.models"),
    "surge.engine.core.request": ("surge.engine.runner", "surge.models"),
    # The runner and the sampler see the core's plain step description (batch.py) only.
    "surge.engine.runner": ("surge.engine.core.scheduler", "surge.engine.core.request",
                            "surge.engine.core.engine_core", "surge.engine.core.policies"),
    "surge.engine.sample": ("surge.engine.core.scheduler", "surge.engine.core.request",
                            "surge.engine.core.engine_core", "surge.engine.runner"),
    # The server talks to the engine through its client and its configs only.
    "surge.server": (*ENGINE_INSIDE, "surge.gateway", "surge.autoscale", "surge.bench"),
    # The Batch API is mounted by the server and the gateway and sends its lines over HTTP (to
    # the app it is mounted in): it knows neither, nor any engine or model code.
    "surge.batch": (
        "surge.models",
        "surge.engine",
        "surge.server",
        "surge.gateway",
        "surge.autoscale",
        "surge.bench",
    ),
    "surge.http": ("surge.models", "surge.engine", "surge.server", "surge.gateway"),
    # The KV-events contract (block hashes, wire format): the engine publishes it, the gateway
    # reads it, and neither may import the other, so it imports neither.
    "surge.kv_events": ("surge.models", "surge.engine", "surge.server", "surge.gateway",
                        "surge.bench"),
    "surge.config": ("surge.models", "surge.engine", "surge.server", "surge.gateway"),
    "surge.observability": ("surge.server", "surge.gateway", "surge.bench", *ENGINE_INSIDE),
    # The autoscaler talks to replicas and the gateway over HTTP and files, and starts them
    # as processes: it imports none of them.
    "surge.autoscale": (
        "surge.models", "surge.engine", "surge.server", "surge.gateway", "surge.bench",
        "surge.batching",
    ),
    # The batcher is generic: it is handed a batch function, and knows no model or server.
    "surge.batching": ("surge.models", "surge.engine", "surge.server", "surge.gateway",
                       "surge.bench"),
    # The fleet simulator drives the autoscaler's decision code with surge bench's traffic
    # models (both imported, neither copied); it runs no model and no server.
    "surge.fleetsim": ("surge.models", "surge.engine", "surge.server", "surge.gateway"),
    # The gateway talks to servers over HTTP only; the bench is a client of any OpenAI server.
    "surge.gateway": ("surge.models", "surge.engine", "surge.server", "surge.bench"),
    "surge.bench": ("surge.models", "surge.engine", "surge.server", "surge.gateway",
                    "surge.observability"),
}  # fmt: skip

# (importer, imported): allowed across a rule above, with the reason.
EXCEPTIONS = {
    # The engine process's entry point: imported inside the spawned child, never by the API
    # process (test_api_process_imports_no_torch checks the process, not the text).
    ("surge.engine.client.spawn", "surge.engine.core.process"),
    # Serving embeddings loads the encoder in the API process, and only then (--embedding-model).
    ("surge.server.embeddings", "surge.models.embedding"),
    # The weights, as tensors, are read in the engine process when ModelFiles.weights() runs.
    ("surge.models.formats.model_files", "surge.models.weights.gguf"),
    ("surge.models.formats.model_files", "surge.models.weights.safetensors"),
    # --policy kv_aware looks up the replicas' block hashes, which are hashes of token ids: the
    # gateway tokenizes as they do, with the model's tokenizer and chat template (torch-free
    # readers, surge.models.formats's own rule), in this one module.
    ("surge.gateway.kv_tokens", "surge.models.formats.model_files"),
    ("surge.gateway.kv_tokens", "surge.models.formats.resolve"),
    ("surge.gateway.kv_tokens", "surge.models.formats.tokenizer"),
}

# Each module at the root of surge/ and the packages beside it: a rule above, or this list.
ROOT_MODULES = {"__init__", "sampling_params", "structured_output"}  # the public request API
ROOT_PACKAGES = {"cli"}  # the command line: it composes every part

# Modules that must not import torch, not even through the surge modules they import: the
# scheduler describes each step as plain data (the sampler's row is engine/sample/sampling_row.py).
NO_TORCH = (
    "surge.engine.core.scheduler", "surge.engine.sample.sampling_row", "surge.sampling_params",
    "surge.engine.core.block_manager", "surge.engine.core.policies",
)  # fmt: skip

# What the API process imports (checked in a fresh interpreter, so lazy paths count too).
API_PROCESS = ("surge.cli.main", "surge.server.launch", "surge.server.app",
               "surge.engine.client.client", "surge.engine.client.spawn")  # fmt: skip


def _python_files() -> list[Path]:
    return [p for d in ("surge", "tests", "benchmarks") for p in (ROOT / d).rglob("*.py")]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _surge_modules() -> dict[str, Path]:
    return {_module(p): p for p in (ROOT / "surge").rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every surge module `path` imports, anywhere in the file (TYPE_CHECKING and function
    bodies included): `from a.b import c` names a.b.c where c is a module, else a.b."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("surge")}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if not node.module.startswith("surge"):
                continue
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if full in modules else node.module)
    return found


def test_no_file_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these files: {long}"


def test_imports_flow_one_way() -> None:
    modules = _surge_modules()
    bad = []
    for module, path in modules.items():
        for name in _imports(path, modules):
            for package, forbidden in FORBIDDEN.items():
                if not (module == package or module.startswith(package + ".")):
                    continue
                hit = [f for f in forbidden if name == f or name.startswith(f + ".")]
                if hit and (module, name) not in EXCEPTIONS:
                    bad.append(f"{module} imports {name} ({package} must not import {hit[0]})")
    assert not bad, "\n".join(sorted(set(bad)))


def test_no_import_cycles_between_files() -> None:
    """Between files, not only packages: a cycle hidden in a function or under TYPE_CHECKING
    still means two modules that cannot be read or tested apart."""
    modules = _surge_modules()
    graph = {m: _imports(p, modules) & modules.keys() - {m} for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                cycles.append(sorted([v, *component]))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_every_root_module_belongs_to_a_rule() -> None:
    ruled = {p.split(".")[1] for p in FORBIDDEN}
    loose = []
    for path in (ROOT / "surge").iterdir():
        name = path.stem if path.suffix == ".py" else path.name
        module = path.suffix == ".py" and name not in ROOT_MODULES
        package = (path / "__init__.py").exists() and name not in ruled | ROOT_PACKAGES
        if module or package:
            loose.append(name)
    assert not loose, f"give these a package with a rule in tests/test_structure.py: {loose}"


def test_fmt_skips_are_few() -> None:
    count = sum(p.read_text().count("# fmt: skip") for p in (ROOT / "surge").rglob("*.py"))
    assert count <= MAX_FMT_SKIPS, f"{count} `# fmt: skip` in surge/ (at most {MAX_FMT_SKIPS})"


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
            # `from surge.engine.sample import sampler` imports surge.engine.sample.sampler
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


@pytest.mark.parametrize("module", API_PROCESS)
def test_api_process_imports_no_torch(module: str) -> None:
    """Imported in a fresh interpreter: neither torch nor the engine's insides are loaded."""
    code = (
        f"import json, sys; import {module}; "
        "print(json.dumps(sorted(m for m in sys.modules if m == 'torch' or "
        "m.startswith(('surge.engine.core', 'surge.engine.runner', 'surge.engine.sample')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_environment_is_read_in_one_place() -> None:
    """surge/config/settings.py reads the environment; others ask it (the one other read is the
    kernels' build putting the venv's ninja first on PATH)."""
    read = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)")
    bad = []
    for path in (ROOT / "surge").rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if read.search(line) and rel != "surge/config/settings.py" and '"PATH"' not in line:
                bad.append(f"{rel}:{n}: {line.strip()}")
    assert not bad, bad
