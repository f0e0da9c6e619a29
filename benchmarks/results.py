"""The measured figures, one JSON line each (benchmarks/results.jsonl), and the summaries made
from them: BENCHMARKS.md's table and the README's, which therefore cannot go stale.

A benchmark (or whoever ran it) appends a result with its command and CPU:

    python benchmarks/results.py add --metric http_1_vs_llamacpp \\
        --title "HTTP, 1 stream, against llama.cpp (Q4_0)" \\
        --figure "141.1 against 91.0 tok/s (1.55x)" --command "bash benchmarks/bench_llamacpp.sh 1"

then `python benchmarks/results.py render` rewrites both tables (`check` says whether they are
current; tests/test_benchmark_summary.py runs it). Each table shows the latest figure of each
metric on each CPU (latest by date, then by order in the file); older lines stay in the file, and
each pass's prose stays in benchmarks/history/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results.jsonl"
HISTORY = "benchmarks/history/2026-12-passes.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
TARGETS = {ROOT / "BENCHMARKS.md": False, ROOT / "README.md": True}  # path -> README rows only


def load(path: Path = RESULTS) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def latest(results: Sequence[dict[str, object]]) -> list[dict[str, object]]:
    """The latest result of each (metric, cpu), in the order each metric first appears."""
    best: dict[tuple[object, object], tuple[str, int, dict[str, object]]] = {}
    for i, r in enumerate(results):
        key = (r["metric"], r["cpu"])
        if key not in best or (str(r["date"]), i) >= best[key][:2]:
            best[key] = (str(r["date"]), i, r)
    first = {r["metric"]: i for i, r in reversed(list(enumerate(results)))}
    return [
        r
        for _, _, r in sorted(
            best.values(), key=lambda b: (first[b[2]["metric"]], str(b[2]["cpu"]))
        )
    ]


def _where(r: dict[str, object]) -> str:
    anchors: list[str] = list(r.get("history") or [])  # type: ignore[call-overload]
    links = [f"[history]({HISTORY}#{a})" for a in anchors]
    command = f"`{r['command']}`" if r.get("command") else ""
    return "; ".join([*([command] if command else []), *links])


def table(results: Sequence[dict[str, object]], readme: bool) -> str:
    rows = [r for r in latest(results) if r.get("readme") or not readme]
    lines = ["| metric | latest figure | date | CPU | command / where |", "|---|---|---|---|---|"]
    for r in rows:
        cells = [r["title"], r["figure"], r["date"], r["cpu"], _where(r)]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _rendered(text: str, body: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def render(check: bool = False) -> list[Path]:
    """Write each target's table (or, checking, list those that differ)."""
    results = load()
    stale = []
    for path, readme in TARGETS.items():
        text = path.read_text(encoding="utf-8")
        new = _rendered(text, table(results, readme))
        if new != text:
            stale.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    return stale


def add(args: argparse.Namespace) -> None:
    entry = {
        "metric": args.metric,
        "title": args.title,
        "figure": args.figure,
        "date": args.date or datetime.date.today().isoformat(),
        "cpu": args.cpu or platform.processor() or platform.machine(),
        "command": args.command,
        "history": args.history or [],
    }
    if args.readme:
        entry["readme"] = True
    with RESULTS.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("render", help="rewrite BENCHMARKS.md's and README's tables")
    sub.add_parser("check", help="exit 1 if a table is not what results.jsonl gives")
    a = sub.add_parser("add", help="append a measured figure")
    for name in ("metric", "title", "figure", "command"):
        a.add_argument(f"--{name}", required=True)
    a.add_argument("--cpu", help="the CPU's name (lscpu's Model name and its vector extensions)")
    a.add_argument("--date", help="YYYY-MM-DD (default today)")
    a.add_argument("--history", action="append", help="an anchor in the history file")
    a.add_argument("--readme", action="store_true", help="show it in the README's table too")
    args = p.parse_args(argv)
    if args.cmd == "add":
        add(args)
        return 0
    stale = render(check=args.cmd == "check")
    for path in stale:
        print(f"{path.relative_to(ROOT)}: {'stale' if args.cmd == 'check' else 'rewritten'}")
    return 1 if stale and args.cmd == "check" else 0


if __name__ == "__main__":
    sys.exit(main())
