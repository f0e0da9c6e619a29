"""/dashboard in a real headless Chromium (Debian's, driven by Playwright): it loads without a
console error, shows the figures /metrics shows, and updates; the gateway's shows the fleet."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.processes import GatewayProcess
from tests.observability.load import Load, words
from tests.servers import ServerProcess

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="no chromium: `make system-deps` installs it"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server  # the session's server of the tiny model


def metric_sum(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    )


def open_page(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/dashboard?slo_ttft=0.5&slo_tpot=0.05")
    page.wait_for_function("Number(document.body.dataset.updates || 0) >= 2", timeout=30_000)
    return page, errors


def number(page: Any, element_id: str) -> float:
    return float(page.inner_text("#" + element_id).replace(",", "").rstrip("%"))


def test_server_dashboard_matches_metrics_and_updates(
    browser: Any, server: ServerProcess, tmp_path: Path
) -> None:
    page, errors = open_page(browser, server.url)
    updates = int(page.evaluate("document.body.dataset.updates"))
    body = {"model": "test-model", "prompt": words(20), "max_tokens": 24, "ignore_eos": True,
            "user": "tenant-a"}  # fmt: skip
    # The server is the session's: other tests' requests are already counted.
    before = number(page, "requests_finished_total")
    with Load(server.url, 2, body) as load:
        page.wait_for_function("Number(document.getElementById('requests_finished_total')"
                               f".textContent.replace(/,/g, '')) >= {before + 4}",
                               timeout=90_000)  # fmt: skip
        assert 0 <= number(page, "running") <= 2 and number(page, "waiting") <= 2
        page.wait_for_function("document.getElementById('tenants').textContent"
                               ".includes('tenant-a')", timeout=30_000)  # fmt: skip
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
    assert load.statuses[200] > 0
    # Quiet now: once the monitor ticked (1 s) and the page polled (1 s), the same totals.
    deadline = time.monotonic() + 30
    want = (0.0, 0.0)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        want = (metric_sum(server.url, "vllm:generation_tokens_total"),
                metric_sum(server.url, "vllm:request_success_total"))  # fmt: skip
        shown = (number(page, "generation_tokens_total"), number(page, "requests_finished_total"))
        if shown == want:
            break
    assert shown == want, (shown, want)
    assert number(page, "running") == 0
    page.wait_for_function(
        f"Number(document.body.dataset.updates) > {updates + 2}", timeout=30_000
    )  # it keeps polling (1 s)
    assert page.text_content("#bottleneck") in ("healthy", "idle", "compute")
    assert page.text_content("#ttft_p99") != "–"  # requests finished in the last minute
    assert not errors, errors


def test_gateway_dashboard_shows_each_upstream(browser: Any, server: ServerProcess) -> None:
    gateway = GatewayProcess("--upstream", server.url)
    try:
        gateway.wait_ready(num_upstreams=1)
        page, errors = open_page(browser, gateway.url)
        page.wait_for_selector(f"#replicas tr[data-url='{server.url}']", timeout=30_000)
        assert "fleet" in page.inner_text("#mode")
        row = page.inner_text(f"#replicas tr[data-url='{server.url}']")
        assert "in rotation" in row and "closed" in row
        assert page.text_content("#bottleneck") in ("healthy", "idle", "compute")
        assert number(page, "generation_tokens_total") == metric_sum(
            server.url, "vllm:generation_tokens_total"
        )
        assert not errors, errors
    finally:
        gateway.stop()
