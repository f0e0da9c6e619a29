"""Replicas on a Ray cluster: each one a Ray actor that runs `surge serve` on the node Ray
placed it on (by the CPUs and GPUs it asks for) and supervises it there; the autoscaler and
the gateway reach it over the network at that node's address.

Only this module imports ray (`pip install 'surge[ray]'`). Every node needs the same Python
environment with surge installed, as Ray's own workers do.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from surge.autoscale.providers.base import (
    Replica,
    ReplicaStartError,
    ReplicaState,
    wait_healthy,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RayProviderConfig:
    serve_args: tuple[str, ...] = ()
    address: str | None = None  # "auto": the running cluster; None: start a local one
    num_cpus: float = 1.0  # what one replica reserves on its node
    num_gpus: float = 0.0
    base_port: int = 8100
    startup_timeout_s: float = 300.0
    host: str | None = None  # the address replicas bind; None: their node's (tests: loopback)
    log_dir: str | None = None  # where replicas write their logs on their node; None: its temp dir


class ReplicaProcess:
    """Runs inside the actor, on the replica's node: one `surge serve` process and its PID."""

    def __init__(
        self, serve_args: tuple[str, ...], base_port: int, host: str | None, log_dir: str | None
    ) -> None:
        self.serve_args = serve_args
        self.base_port = base_port
        self.host = host
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> tuple[str, int, str]:
        """(url, pid, log path) of the server it started on this node."""
        host = self.host or ray.util.get_node_ip_address()
        port = self._free_port(host)
        folder = Path(self.log_dir or tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        log_path = str(folder / f"surge-ray-replica-{port}.log")
        cmd = [
            sys.executable,
            "-m",
            "surge.cli",
            "serve",
            "--host",
            host,
            "--port",
            str(port),
            *self.serve_args,
        ]
        with open(log_path, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return f"http://{host}:{port}", self.proc.pid, log_path

    def _free_port(self, host: str) -> int:
        for port in range(self.base_port, self.base_port + 1000):
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free port from {self.base_port} on {host}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM (the server drains), then SIGKILL after `timeout_s`; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class RayProvider:
    def __init__(self, config: RayProviderConfig) -> None:
        self.config = config
        if not ray.is_initialized():
            ray.init(address=config.address, include_dashboard=False, log_to_driver=False)
        self._actor_class: Any = ray.remote(ReplicaProcess)
        self._actors: dict[str, Any] = {}
        self._replicas: dict[str, Replica] = {}
        self._alive: dict[str, bool] = {}
        self._ids = itertools.count()

    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    async def start(self) -> Replica:
        cfg = self.config
        actor: Any = self._actor_class.options(num_cpus=cfg.num_cpus, num_gpus=cfg.num_gpus).remote(
            cfg.serve_args, cfg.base_port, cfg.host, cfg.log_dir
        )
        try:
            url, pid, log_path = await actor.start.remote()
        except Exception as e:
            ray.kill(actor)
            raise ReplicaStartError(f"a Ray replica could not start: {e}") from e
        rid = f"ray-replica-{next(self._ids)}"
        node = url.split("//")[1].rsplit(":", 1)[0]
        replica = Replica(
            rid, url, started_s=time.monotonic(), pid=pid, labels={"log": log_path, "node": node}
        )
        self._actors[rid], self._replicas[rid], self._alive[rid] = actor, replica, True
        log.info("replica %s starting on %s (pid %d there)", rid, url, pid)
        try:
            where = f"{log_path} on {node}"
            await wait_healthy(
                replica.url,
                f"replica {rid}",
                actor.alive.remote,
                cfg.startup_timeout_s,
                where,
                poll_s=0.5,
            )
        except BaseException:
            await self._stop(replica, timeout_s=5.0)
            raise
        replica.state = ReplicaState.READY
        log.info("replica %s ready after %.1fs", rid, time.monotonic() - replica.started_s)
        return replica

    def alive(self, replica: Replica) -> bool:
        """From the last check (the controller asks every tick; `refresh` keeps it current)."""
        return self._alive.get(replica.id, False)

    async def refresh(self) -> None:
        """Ask every actor whether its server still runs (a dead actor counts as dead)."""

        async def check(rid: str, actor: Any) -> None:
            try:
                self._alive[rid] = bool(await actor.alive.remote())
            except Exception:  # the actor (or its node) is gone
                self._alive[rid] = False

        await asyncio.gather(*(check(rid, a) for rid, a in list(self._actors.items())))

    async def drain(self, replica: Replica, timeout_s: float) -> None:
        replica.state = ReplicaState.DRAINING
        await self._stop(replica, timeout_s)

    async def _stop(self, replica: Replica, timeout_s: float) -> None:
        actor = self._actors.pop(replica.id, None)
        if actor is None:
            return
        try:
            replica.exit_code = await actor.stop.remote(timeout_s)
        except Exception as e:  # the actor or its node died: nothing left to stop there
            log.warning("replica %s: %s", replica.id, e)
        ray.kill(actor)
        replica.state = ReplicaState.STOPPED
        self._replicas.pop(replica.id, None)
        self._alive.pop(replica.id, None)
        log.info("replica %s stopped (exit %s)", replica.id, replica.exit_code)

    async def close(self, timeout_s: float) -> None:
        await asyncio.gather(*(self._stop(r, timeout_s) for r in self.replicas()))
