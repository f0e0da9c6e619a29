"""`surge top`: its rows and sorting as pure functions, and the real program under tmux against
a real server under load: the screen shows the server's figures, sorts on a key, quits on q."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from surge.cli.top import View, render, rows_of, sort_rows
from tests.observability.load import Load, words
from tests.servers import ServerProcess

FLEET = {
    "kind": "fleet", "running": 3, "waiting": 1, "tokens_per_s": 30.0, "kv_usage": 0.5,
    "bottleneck": {"kind": "compute", "reason": "r", "action": "a"},
    "autoscaler": {"desired": 3, "ready": 2, "forecast_rps": 1.5},
    "replicas": [
        {"url": "http://a", "healthy": True, "breaker": "closed", "in_flight": 1, "error": None,
         "state": {"running": 1, "waiting": 0, "tokens_per_s": 10.0, "kv_usage": 0.2,
                   "ttft_p99_s": 0.2, "tpot_p99_s": 0.01, "prefix_hit_rate": None,
                   "bottleneck": {"kind": "healthy", "reason": ""}}},
        {"url": "http://b", "healthy": True, "breaker": "closed", "in_flight": 2, "error": None,
         "state": {"running": 2, "waiting": 1, "tokens_per_s": 20.0, "kv_usage": 0.8,
                   "ttft_p99_s": 0.9, "tpot_p99_s": 0.05, "prefix_hit_rate": 0.5,
                   "bottleneck": {"kind": "compute", "reason": ""}}},
        {"url": "http://c", "healthy": False, "breaker": "open", "in_flight": 0,
         "error": "ConnectError", "state": None},
    ],
}  # fmt: skip


def test_rows_and_sorting() -> None:
    rows = rows_of(FLEET, "http://gw")
    assert [r["url"] for r in rows] == ["http://a", "http://b", "http://c"]
    assert rows[2]["bottleneck"] == "ConnectError" and rows[2]["running"] is None
    view = View()
    assert view.press("t") and view.sort_key == "t"
    assert [r["url"] for r in sort_rows(rows, view)] == ["http://b", "http://a", "http://c"]
    view.press("t")  # again: reversed
    assert sort_rows(rows, view)[0]["url"] == "http://c"
    assert not view.press("q")
    single = rows_of({"kind": "server", "running": 4, "bottleneck": {"kind": "idle"}}, "u")
    assert single[0]["running"] == 4 and single[0]["up"] is None


def test_render_names_the_bottleneck_and_autoscaler() -> None:
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render(FLEET, "http://gw", View("k"), (0.5, 0.05)))
    text = console.export_text()
    assert "COMPUTE" in text and "desired 3" in text and "ready 2" in text
    assert text.index("http://b") < text.index("http://a")  # KV descending


TMUX = shutil.which("tmux")


@pytest.mark.skipif(TMUX is None, reason="no tmux: `make system-deps` installs it")
def test_top_under_tmux_against_a_loaded_server(tiny_server: ServerProcess) -> None:
    s = tiny_server
    sock = f"surge-top-{s.port}-{os.getpid()}"
    # The size given to rich as well: a detached session may keep tmux's default 80x24.
    env = f"PYTHONPATH={os.environ.get('PYTHONPATH', '')} COLUMNS=170 LINES=40"
    cmd = f"env {env} {sys.executable} -m surge.cli top {s.url} --sort t"

    def tmux(*args: str) -> str:
        out = subprocess.run([TMUX, "-L", sock, *args], capture_output=True, text=True, timeout=10)
        return out.stdout

    tmux("new-session", "-d", "-s", "top", "-x", "170", "-y", "40", "-c", str(Path.cwd()), cmd)
    try:
        body = {"model": "test-model", "prompt": words(10), "max_tokens": 40, "ignore_eos": True}
        with Load(s.url, 2, body):
            screen, row = "", None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and row is None:
                time.sleep(0.5)
                screen = tmux("capture-pane", "-p", "-t", "top")
                # url, running, waiting, tok/s ... on the server's row, once tokens flow
                m = re.search(re.escape(s.url) + r"[\s│]+(\d+)[\s│]+(\d+)[\s│]+([\d.]+)", screen)
                if m and float(m.group(3)) > 0:
                    row = m
            assert row is not None, screen
            assert int(row.group(1)) <= 2 and int(row.group(2)) <= 2
            assert "sorted by tok/s" in screen and "bottleneck:" in screen
            assert re.search(r"\b(healthy|compute|idle)\b", screen), screen
        # After the load: the screen settles on what /metrics says (nothing running).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.5)
            screen = tmux("capture-pane", "-p", "-t", "top")
            m = re.search(re.escape(s.url) + r"[\s│]+(\d+)[\s│]+(\d+)", screen)
            if m and (int(m.group(1)), int(m.group(2))) == (0, 0):
                break
        assert s.metric("vllm:num_requests_running") == 0
        assert m is not None and (int(m.group(1)), int(m.group(2))) == (0, 0), screen
        tmux("send-keys", "-t", "top", "t")
        time.sleep(1.5)
        assert "(reversed)" in tmux("capture-pane", "-p", "-t", "top")
        tmux("send-keys", "-t", "top", "q")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "top" in tmux("list-sessions"):
            time.sleep(0.3)
        assert "top" not in tmux("list-sessions")  # q quit the program, closing its pane
    finally:
        tmux("kill-server")
