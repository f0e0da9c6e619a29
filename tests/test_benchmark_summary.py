"""BENCHMARKS.md's and the README's tables are what benchmarks/results.jsonl gives, and every
result names what a reader needs to trust it: a date, a CPU, and a command or the pass it came
from (whose heading exists)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _results() -> ModuleType:
    spec = importlib.util.spec_from_file_location("results", ROOT / "benchmarks" / "results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors (mkdocs.yml's slugify does the same)."""
    heads = re.findall(r"^#+ (.+)$", markdown, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_tables_are_current() -> None:
    stale = _results().render(check=True)
    assert not stale, f"run `python benchmarks/results.py render`: {stale} differ"


def test_every_result_says_where_it_came_from() -> None:
    results = _results()
    history = _anchors((ROOT / results.HISTORY).read_text(encoding="utf-8"))
    for r in results.load():
        assert {"metric", "title", "figure", "date", "cpu"} <= r.keys(), r
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", r["date"]), r
        assert r.get("command") or r.get("history"), f"{r['metric']}: no command, no pass"
        missing = [a for a in r.get("history", []) if a not in history]
        assert not missing, f"{r['metric']}: no such heading in the history: {missing}"


def test_the_latest_result_wins() -> None:
    results = _results()
    rows = [
        {"metric": "m", "cpu": "c", "date": "2026-12-05", "figure": "old"},
        {"metric": "m", "cpu": "c", "date": "2026-12-06", "figure": "new"},
        {"metric": "m", "cpu": "d", "date": "2026-12-01", "figure": "other cpu"},
        {"metric": "m", "cpu": "c", "date": "2026-12-04", "figure": "older, appended later"},
    ]
    assert [r["figure"] for r in results.latest(rows)] == ["new", "other cpu"]
