"""Upstreams found by DNS (`--upstream dns://NAME:PORT`): the pool follows the addresses a name
resolves to, keeping an upstream's state while it stays.

The real test runs a real gateway whose name lookups go through nss_wrapper (cwrap's
LD_PRELOAD library, Debian `libnss-wrapper`, installed by `make system-deps`): its hosts file
is one the test rewrites, so the same getaddrinfo call the gateway makes in a cluster answers
with addresses the test controls. No system file is touched. Two real servers listen on the
same port on 127.0.0.1 and 127.0.0.2 (the whole 127/8 is loopback), as two pods behind one
headless Service would.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import httpx
import pytest

from surge.gateway.config import GatewayConfig, UpstreamConfig
from surge.gateway.dns_watch import discover_once
from surge.gateway.upstreams import PRIMARY, UpstreamPool
from surge.http.discovery import DnsTarget, resolve
from tests.gateway.processes import GatewayProcess
from tests.servers import ServerProcess

NSS_WRAPPER = Path("/usr/lib/x86_64-linux-gnu/libnss_wrapper.so")
NAME = "surge-replicas.surge-test"


def test_pool_merges_static_file_and_discovered_upstreams() -> None:
    config = GatewayConfig(upstreams=(UpstreamConfig("http://10.0.0.1:8000"),))
    pool = UpstreamPool(config)
    pool.set_dynamic([UpstreamConfig("http://10.0.0.2:8000", weight=3)])
    assert pool.set_discovered(["http://10.0.0.2:8000", "http://10.0.0.3:8000"])
    kept = pool.get("http://10.0.0.3:8000")
    assert sorted(u.url for u in pool.all()) == [f"http://10.0.0.{i}:8000" for i in (1, 2, 3)]
    assert pool.get("http://10.0.0.2:8000").config.weight == 3  # type: ignore[union-attr]
    assert not pool.set_discovered(["http://10.0.0.3:8000", "http://10.0.0.2:8000"])
    assert pool.get("http://10.0.0.3:8000") is kept  # breaker and health state kept
    assert pool.set_discovered(["http://10.0.0.4:8000"])
    assert sorted(u.url for u in pool.all()) == [f"http://10.0.0.{i}:8000" for i in (1, 2, 4)]
    assert pool.set_discovered([])  # scaled to zero: static and file upstreams stay
    assert [u.group for u in pool.all()] == [PRIMARY, PRIMARY]


def test_discover_once_unites_every_target() -> None:
    answers = {"a": ("http://10.0.0.1:80",), "b": ("http://10.0.0.1:80", "http://10.0.0.2:80")}
    pool = UpstreamPool(GatewayConfig(discover=("dns://a:80",)))
    targets = [DnsTarget("a", 80), DnsTarget("b", 80)]
    assert asyncio.run(discover_once(pool, targets, lambda t: answers[t.host]))
    assert sorted(u.url for u in pool.all()) == ["http://10.0.0.1:80", "http://10.0.0.2:80"]


def test_config_checks_dns_targets() -> None:
    with pytest.raises(ValueError, match="dns://NAME:PORT"):
        GatewayConfig(discover=("dns://no-port",))
    assert resolve(DnsTarget("localhost", 80))  # the real resolver answers for localhost


def test_gateway_resolves_localhost(tiny_server: ServerProcess) -> None:
    """The real resolver, no wrapper: dns://localhost:PORT finds the server on 127.0.0.1."""
    gw = GatewayProcess("--upstream", f"dns://localhost:{tiny_server.port}")
    try:
        gw.wait_ready()
        assert f"http://127.0.0.1:{tiny_server.port}" in gw.health()["upstreams"]  # type: ignore[operator]
        r = httpx.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                       timeout=60)  # fmt: skip
        assert r.status_code == 200
    finally:
        gw.stop()


class _Hosts:
    """The hosts file nss_wrapper reads; it reloads on an mtime change, so each write moves the
    mtime on by whole seconds (the wrapper compares seconds)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._bump = 0

    def write(self, *addresses: str) -> None:
        self.path.write_text("".join(f"{a} {NAME}\n" for a in addresses))
        self._bump += 2
        t = time.time() + self._bump
        os.utime(self.path, (t, t))


def _wait_upstreams(gw: GatewayProcess, urls: set[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        ups = gw.health()["upstreams"]
        assert isinstance(ups, dict)
        if set(ups) == urls and all(u["healthy"] for u in ups.values()):
            return
        assert time.monotonic() < deadline, f"upstreams {sorted(ups)}, want {urls}:\n{gw.log()}"
        time.sleep(0.1)


def _received(server: ServerProcess) -> float:
    try:
        return server.metric("surge:requests_received_total")
    except KeyError:  # no request yet: the labelled counter has no sample
        return 0.0


@pytest.mark.skipif(
    not NSS_WRAPPER.exists(),
    reason=f"{NSS_WRAPPER} missing: `make system-deps` installs Debian's libnss-wrapper",
)
def test_gateway_follows_pods_that_come_and_go(
    tmp_path: Path, tiny_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = tiny_server.port
    one, two = f"http://127.0.0.1:{port}", f"http://127.0.0.2:{port}"
    second = ServerProcess(tiny_server_model(tiny_server), host="127.0.0.2", port=port)
    hosts = _Hosts(tmp_path / "hosts")
    hosts.write("127.0.0.1")
    # Only the gateway (started after this) sees the wrapper; the name exists nowhere else.
    monkeypatch.setenv("LD_PRELOAD", str(NSS_WRAPPER))
    monkeypatch.setenv("NSS_WRAPPER_HOSTS", str(hosts.path))
    gw = GatewayProcess("--upstream", f"dns://{NAME}:{port}", "--discover-interval", "0.2",
                        "--policy", "round_robin", "--health-interval", "0.2")  # fmt: skip
    try:
        gw.wait_ready()
        _wait_upstreams(gw, {one})
        hosts.write("127.0.0.1", "127.0.0.2")  # a pod joins
        _wait_upstreams(gw, {one, two})
        before = _received(second)
        for _ in range(4):  # round robin over both: the new one gets some
            r = httpx.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                           timeout=60)  # fmt: skip
            assert r.status_code == 200
        assert _received(second) >= before + 1
        hosts.write("127.0.0.2")  # a pod leaves
        _wait_upstreams(gw, {two})
        r = httpx.post(gw.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                       timeout=60)  # fmt: skip
        assert r.status_code == 200
    finally:
        gw.stop()
        second.stop()


def tiny_server_model(server: ServerProcess) -> str:
    """The model folder `server` was started with (its command line)."""
    cmd = server.proc.args
    assert isinstance(cmd, list)
    return str(cmd[cmd.index("--model") + 1])
