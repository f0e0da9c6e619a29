"""mkdocs hooks: the README becomes the site's home page, BENCHMARKS.md and its history pages.

Both stay where a reader of the repository finds them (its root); here their links are
rewritten to the site's paths, and the docs pages' links to them (`../BENCHMARKS.md`) too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).parent
FROM_ROOT = {
    "README.md": "index.md",
    "BENCHMARKS.md": "benchmarks.md",
    "benchmarks/history/2026-12-passes.md": "benchmarks-history.md",
}


def _root_page(text: str) -> str:
    """A root file's links as seen from docs/: `docs/x.md` -> `x.md`, the other root files."""
    text = text.replace("](docs/", "](").replace("](../../docs/", "](")
    text = text.replace("](../../BENCHMARKS.md", "](benchmarks.md")
    for src, uri in FROM_ROOT.items():
        text = text.replace(f"]({src}", f"]({uri}")
    return text


def on_files(files: Files, config: Any) -> Files:
    for src, uri in FROM_ROOT.items():
        content = _root_page((ROOT / src).read_text(encoding="utf-8"))
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    for src, uri in FROM_ROOT.items():
        markdown = markdown.replace(f"](../{src}", f"]({uri}")
    return markdown
