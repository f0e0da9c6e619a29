"""Replicas as local `surge serve` processes on 127.0.0.1, each on its own port, tracked and
stopped by PID only (never by name). A replica's output goes to a log file of its own."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from surge.autoscale.providers.base import (
    Replica,
    ReplicaStartError,
    ReplicaState,
    wait_healthy,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalProviderConfig:
    serve_args: tuple[str, ...] = ()  # passed to `surge serve` after --host and --port
    host: str = "127.0.0.1"
    base_port: int = 8100  # replicas take the free ports from here up
    startup_timeout_s: float = 300.0
    log_dir: Path = Path("/tmp")
    # Cores of its own for each replica (pinned, and its thread pools sized to them). Replicas
    # whose thread pools each span every core fight over them: on 2 cores, a second replica
    # starting beside a busy one made requests 10x slower (BENCHMARKS.md, autoscaler). None:
    # no pinning (GPU replicas, or a box with cores to spare).
    cpus_per_replica: int | None = None


class LocalProcessProvider:
    def __init__(self, config: LocalProviderConfig) -> None:
        self.config = config
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._replicas: dict[str, Replica] = {}
        self._ids = itertools.count()
        self._ports_taken: set[int] = set()
        self._cores: dict[str, tuple[int, ...]] = {}  # replica id -> the cores it is pinned to

    def replicas(self) -> list[Replica]:
        return list(self._replicas.values())

    def _free_port(self) -> int:
        for port in range(self.config.base_port, self.config.base_port + 1000):
            if port in self._ports_taken:
                continue
            with socket.socket() as s:
                try:
                    s.bind((self.config.host, port))
                except OSError:
                    continue
            return port
        raise ReplicaStartError(f"no free port from {self.config.base_port}")

    async def start(self) -> Replica:
        cfg = self.config
        port = self._free_port()
        self._ports_taken.add(port)
        rid = f"replica-{next(self._ids)}-{port}"
        cmd = [
            sys.executable,
            "-m",
            "surge.cli",
            "serve",
            "--host",
            cfg.host,
            "--port",
            str(port),
            *cfg.serve_args,
        ]
        log_path = cfg.log_dir / f"surge-autoscale-{rid}.log"
        cores = self._pick_cores()
        env = dict(os.environ)
        if cores:
            env["OMP_NUM_THREADS"] = str(len(cores))  # torch's pools: one thread per own core
        with log_path.open("wb") as out:
            # A session of its own: a Ctrl-C at the autoscaler's terminal is the autoscaler's
            # to handle (it drains the replicas), not a signal to every replica at once.
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        if cores:
            # At once, while the child is still importing: the engine process it spawns later,
            # and every thread, inherit the mask.
            os.sched_setaffinity(proc.pid, cores)
            self._cores[rid] = cores
        labels = {"log": str(log_path)}
        if cores:
            labels["cores"] = ",".join(map(str, cores))
        replica = Replica(
            rid,
            f"http://{cfg.host}:{port}",
            started_s=time.monotonic(),
            pid=proc.pid,
            labels=labels,
        )
        self._procs[rid] = proc
        self._replicas[rid] = replica
        log.info("replica %s starting (pid %d), log %s", rid, proc.pid, log_path)
        try:

            async def running() -> bool:
                return proc.poll() is None

            await wait_healthy(
                replica.url, f"replica {rid}", running, cfg.startup_timeout_s, str(log_path)
            )
        except BaseException:
            await self._stop(replica, timeout_s=5.0)
            raise
        replica.state = ReplicaState.READY
        log.info("replica %s ready after %.1fs", rid, time.monotonic() - replica.started_s)
        return replica

    def _pick_cores(self) -> tuple[int, ...]:
        """The least-used slot of `cpus_per_replica` cores (free ones first); () if not pinning."""
        per = self.config.cpus_per_replica
        if not per:
            return ()
        mine = sorted(os.sched_getaffinity(0))
        slots = [tuple(mine[i : i + per]) for i in range(0, len(mine) - per + 1, per)]
        if not slots:  # fewer cores than asked for: all of them
            return tuple(mine)
        used = list(self._cores.values())
        return min(slots, key=lambda s: (used.count(s), slots.index(s)))

    async def refresh(self) -> None:
        """Nothing to do: `alive` asks the local process directly."""

    def alive(self, replica: Replica) -> bool:
        proc = self._procs.get(replica.id)
        return proc is not None and proc.poll() is None

    async def drain(self, replica: Replica, timeout_s: float) -> None:
        replica.state = ReplicaState.DRAINING
        await self._stop(replica, timeout_s)

    async def _stop(self, replica: Replica, timeout_s: float) -> None:
        proc = self._procs.get(replica.id)
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # `surge serve` drains, then exits 0
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if proc.poll() is None:
                log.warning("replica %s still running after %.0fs: killing", replica.id, timeout_s)
                proc.kill()
                await asyncio.to_thread(proc.wait)
        replica.exit_code = proc.returncode
        replica.state = ReplicaState.STOPPED
        del self._procs[replica.id]
        del self._replicas[replica.id]
        self._cores.pop(replica.id, None)
        port = int(replica.url.rsplit(":", 1)[1])
        self._ports_taken.discard(port)
        log.info("replica %s stopped (exit %s)", replica.id, replica.exit_code)

    async def close(self, timeout_s: float) -> None:
        await asyncio.gather(*(self._stop(r, timeout_s) for r in self.replicas()))
