"""A request's own deadline (x-surge-timeout, seconds): shorter than the server's
--request-timeout, it ends the request there, in the engine too; a bad value is a 400."""

from __future__ import annotations

import json
import time

import httpx

from tests.servers import ServerProcess

LONG = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True}


def _aborts(server: ServerProcess) -> float:
    try:
        return server.metric("surge:request_aborts_total", reason="timeout")
    except KeyError:
        return 0.0


def test_a_deadline_ends_a_long_request_with_504_and_frees_the_engine(
    tiny_server: ServerProcess,
) -> None:
    before = _aborts(tiny_server)
    t0 = time.monotonic()
    r = httpx.post(tiny_server.url + "/v1/completions", json=LONG, timeout=60,
                   headers={"x-surge-timeout": "0.3"})  # fmt: skip
    took = time.monotonic() - t0
    assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
    assert 0.25 < took < 3  # 2,000 tokens take the tiny model over 1 s on a fast machine
    assert _aborts(tiny_server) == before + 1
    running = tiny_server.metric("vllm:num_requests_running")
    deadline = time.monotonic() + 5
    while running and time.monotonic() < deadline:  # the engine has let it go
        time.sleep(0.1)
        running = tiny_server.metric("vllm:num_requests_running")
    assert running == 0


def test_a_streamed_request_ends_with_a_timeout_event(tiny_server: ServerProcess) -> None:
    with httpx.stream("POST", tiny_server.url + "/v1/completions", timeout=60,
                      json={**LONG, "stream": True},
                      headers={"x-surge-timeout": "0.5"}) as r:  # fmt: skip
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "timeout"
    assert len(events) > 3  # tokens came first


def test_a_bad_deadline_is_a_400_and_a_long_one_changes_nothing(
    tiny_server: ServerProcess,
) -> None:
    for bad in ("soon", "0", "-1", "inf", "nan"):
        r = httpx.post(tiny_server.url + "/v1/completions", json=LONG,
                       headers={"x-surge-timeout": bad}, timeout=30)  # fmt: skip
        assert r.status_code == 400, bad
        assert r.json()["error"]["param"] == "x-surge-timeout"
    ok = httpx.post(tiny_server.url + "/v1/completions", timeout=60,
                    json={"prompt": "hi", "max_tokens": 4, "ignore_eos": True},
                    headers={"x-surge-timeout": "1e9"})  # capped by --request-timeout # fmt: skip
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 4
