"""The `surge` command line (`main`), `surge serve`'s flags and `surge top`."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from surge.cli.main import main as run

    return run(argv)
