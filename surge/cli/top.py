"""`surge top [URL]`: a terminal view of a server or, through a gateway, its fleet, redrawn every
second from /v1/dashboard/state: the same figures as /dashboard, one row per replica with its
bottleneck. Keys: r running, w waiting, t tokens/s, k KV, f TTFT p99, p TPOT p99, b bottleneck,
u URL (sort; the same key again reverses), q quit."""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

# key -> (column title, sort key over a row, descending first)
SORTS: dict[str, tuple[str, str, bool]] = {
    "r": ("running", "running", True),
    "w": ("waiting", "waiting", True),
    "t": ("tok/s", "tokens_per_s", True),
    "k": ("KV", "kv_usage", True),
    "f": ("TTFT p99", "ttft_p99_s", True),
    "p": ("TPOT p99", "tpot_p99_s", True),
    "b": ("bottleneck", "bottleneck", False),
    "u": ("replica", "url", False),
}
_CALM = ("healthy", "idle")


@dataclass
class View:
    sort_key: str = "u"
    reverse: bool = False

    def press(self, key: str) -> bool:
        """Apply a key; False means quit."""
        if key in ("q", "\x03"):
            return False
        if key in SORTS:
            if key == self.sort_key:
                self.reverse = not self.reverse
            else:
                self.sort_key, self.reverse = key, False
        return True


def rows_of(state: dict[str, Any], url: str) -> list[dict[str, Any]]:
    """One row per replica: a server's own state, or each upstream of a gateway's fleet."""
    if state.get("kind") != "fleet":
        return [_row(url, state, "", None)]
    return [_row(r["url"], r.get("state"), r["breaker"], r) for r in state["replicas"]]


def _row(url: str, s: dict[str, Any] | None, breaker: str, up: dict[str, Any] | None) -> dict:
    s = s or {}
    b = s.get("bottleneck") or {}
    return {
        "url": url,
        "up": None if up is None else bool(up["healthy"]),
        "breaker": breaker,
        "running": s.get("running"),
        "waiting": s.get("waiting"),
        "tokens_per_s": s.get("tokens_per_s"),
        "kv_usage": s.get("kv_usage"),
        "ttft_p99_s": s.get("ttft_p99_s"),
        "tpot_p99_s": s.get("tpot_p99_s"),
        "prefix_hit_rate": s.get("prefix_hit_rate"),
        "bottleneck": b.get("kind") or (up or {}).get("error") or "?",
        "reason": b.get("reason", ""),
    }


def sort_rows(rows: list[dict[str, Any]], view: View) -> list[dict[str, Any]]:
    _, field, descending = SORTS[view.sort_key]

    def key(r: dict[str, Any]) -> tuple[bool, Any]:
        v = r.get(field)
        return (v is None, v if v is not None else 0)

    ordered = sorted(rows, key=key, reverse=descending)
    if descending:  # None last either way
        ordered = [r for r in ordered if r.get(field) is not None] + [
            r for r in ordered if r.get(field) is None
        ]
    return ordered[::-1] if view.reverse else ordered


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}ms"


def render(state: dict[str, Any], url: str, view: View, slo: tuple[float, float]) -> Group:
    rows = sort_rows(rows_of(state, url), view)
    fleet = state.get("kind") == "fleet"
    b = state.get("bottleneck") or {}
    head = Text()
    head.append(f"surge top  {url}  ", style="bold")
    head.append("fleet" if fleet else f"model {state.get('model', '?')}")
    head.append(f"   running {state.get('running', 0)}  waiting {state.get('waiting', 0)}  ")
    head.append(f"tok/s {_num(state.get('tokens_per_s'))}  KV {_num(_pct(state), '{:.1f}%')}")
    a = state.get("autoscaler")
    if a:
        head.append(
            f"\nautoscaler: desired {_num(a.get('desired'), '{:.0f}')}  ready "
            f"{_num(a.get('ready'), '{:.0f}')}  forecast "
            f"{_num(a.get('forecast_rps'), '{:.2f}')} req/s"
        )
    batch = state.get("batch")
    if batch:
        head.append(_batch_line(batch))
    kind = b.get("kind", "?")
    line = Text("\nbottleneck: ")
    line.append(kind.upper(), style="green bold" if kind in _CALM else "yellow bold")
    line.append(f"  {b.get('reason', '')}\n")
    line.append(f"suggested: {b.get('action', '')}", style="cyan")
    title, _, _ = SORTS[view.sort_key]
    order = f"sorted by {title}{' (reversed)' if view.reverse else ''}"
    table = Table(title=f"{order}  [r w t k f p b u: sort, q: quit]", title_justify="left")
    for col in (
        "replica",
        "state",
        "running",
        "waiting",
        "tok/s",
        "KV",
        "TTFT p99",
        "TPOT p99",
        "prefix hit",
        "bottleneck",
    ):
        left = col in ("replica", "bottleneck")
        table.add_column(
            col,
            justify="left" if left else "right",
            no_wrap=True,
            min_width=len(col) if not left else 11,
        )
    for r in rows:
        state_cell = "" if r["up"] is None else ("up" if r["up"] else "out") + f" {r['breaker']}"
        kind_style = "green" if r["bottleneck"] in _CALM else "yellow"
        table.add_row(
            r["url"],
            state_cell,
            _num(r["running"], "{:.0f}"),
            _num(r["waiting"], "{:.0f}"),
            _num(r["tokens_per_s"]),
            _num(None if r["kv_usage"] is None else 100 * r["kv_usage"], "{:.1f}%"),
            Text(_ms(r["ttft_p99_s"]), style=_slo_style(r["ttft_p99_s"], slo[0])),
            Text(_ms(r["tpot_p99_s"]), style=_slo_style(r["tpot_p99_s"], slo[1])),
            _num(None if r["prefix_hit_rate"] is None else 100 * r["prefix_hit_rate"], "{:.0f}%"),
            Text(r["bottleneck"], style=kind_style),
        )
    return Group(head, line, table)


def _batch_line(batch: dict[str, Any]) -> str:
    """The Batch API's lines (surge/batch), or why it is unavailable."""
    if not batch.get("available") or not batch.get("storage_ok", True):
        return f"\nbatch: unavailable ({batch.get('error') or 'storage'})"
    lines, left = batch.get("lines") or {}, batch.get("window_seconds_left")
    return (
        f"\nbatch: {lines.get('pending', 0)} pending  {lines.get('in_flight', 0)} in flight "
        f"(limit {batch.get('concurrency_limit', 0)})  {lines.get('completed', 0)} done  "
        f"{lines.get('failed', 0)} failed  {_num(batch.get('lines_per_second'), '{:.2f}')} "
        f"lines/s  window left {'–' if left is None else f'{left / 60:.0f} min'}"
    )


def _pct(state: dict[str, Any]) -> float | None:
    kv = state.get("kv_usage")
    return None if kv is None else 100 * kv


def _slo_style(x: float | None, limit: float) -> str:
    if x is None:
        return ""
    return "green" if x <= limit else "yellow" if x <= 2 * limit else "red"


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[], str | None]]:
    """Single key presses from a terminal without Enter; none when stdin is not a terminal."""
    if not sys.stdin.isatty():
        yield lambda: None
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:

        def read() -> str | None:
            if select.select([fd], [], [], 0)[0]:
                return os.read(fd, 1).decode(errors="ignore")
            return None

        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def fetch(client: httpx.Client, url: str) -> dict[str, Any]:
    r = client.get(url + "/v1/dashboard/state", timeout=5)
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="surge top", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "url",
        nargs="?",
        default="http://127.0.0.1:8000",
        help="a `surge serve` or `surge gateway` (then every upstream)",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between redraws")
    p.add_argument("--sort", choices=sorted(SORTS), default="u", help="the first sort key")
    p.add_argument("--slo-ttft", type=float, default=1.0, help="seconds; colours TTFT p99")
    p.add_argument("--slo-tpot", type=float, default=0.1, help="seconds; colours TPOT p99")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    args = p.parse_args(list(argv))
    url = args.url.rstrip("/")
    view, slo = View(args.sort), (args.slo_ttft, args.slo_tpot)
    console = Console()
    with httpx.Client() as client:
        if args.once:
            console.print(render(fetch(client, url), url, view, slo))
            return 0
        with _keys() as key, Live(console=console, auto_refresh=False, screen=True) as live:
            next_s = 0.0
            while True:
                pressed = key()
                if pressed is not None and not view.press(pressed):
                    return 0
                now = time.monotonic()
                if now >= next_s or pressed is not None:
                    try:
                        frame: Any = render(fetch(client, url), url, view, slo)
                    except (httpx.HTTPError, ValueError) as e:
                        frame = Text(f"surge top: cannot read {url}: {e}", style="red")
                    live.update(frame, refresh=True)
                    next_s = now + args.interval
                time.sleep(0.05)
