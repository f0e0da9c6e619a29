"""The docs site (mkdocs.yml, docs/, the README as its home page, BENCHMARKS.md) builds with
`mkdocs build --strict`: a broken link or anchor, or a page left out of the nav, fails it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE_FILES = (
    "mkdocs.yml",
    "mkdocs_hooks.py",
    "README.md",
    "BENCHMARKS.md",
    "benchmarks/history/2026-12-passes.md",
)


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    out = _build(ROOT, tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    # The README is the home page and BENCHMARKS.md a page, their links rewritten for the site.
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert 'href="serving/' in home and 'href="benchmarks/' in home
    assert (tmp_path / "site" / "benchmarks" / "index.html").is_file()


def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    for name in SITE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text() + "\n[gone](docs/no-such-page.md)\n")
    bench = tmp_path / "docs" / "bench.md"
    bench.write_text(bench.read_text() + "\n[gone](gateway.md#no-such-anchor)\n")
    out = _build(tmp_path, tmp_path / "site")
    assert out.returncode != 0
    log = out.stdout + out.stderr
    assert "no-such-page.md" in log and "no-such-anchor" in log


def test_the_readme_stays_a_front_page() -> None:
    """The detail lives in docs/ (issue 34): the README keeps to a page or two."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move detail into docs/"
