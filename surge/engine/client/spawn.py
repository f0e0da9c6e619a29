"""Starting the engine-core process, apart from waiting for it to be ready.

The API process spawns it first thing, then does its own start (imports, the tokenizer, the
app) while the engine does its own (imports, weights, KV cache): on two cores the two overlap.
This module imports neither torch nor the engine: the child imports them itself.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from surge.engine.client.protocol import Fatal, Ready
from surge.engine.config import EngineConfig

PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


class EngineDeadError(RuntimeError):
    """The engine process is gone: in-flight requests cannot finish."""


@dataclass
class SpawnedEngine:
    """An engine-core process and the API process's ends of its two pipes."""

    process: BaseProcess
    to_engine: Connection
    from_engine: Connection

    def wait_ready(self, timeout_s: float) -> Ready:
        """Block until the engine says it is ready; EngineDeadError (the process killed) if it
        fails or does not answer within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.from_engine.poll(0.5):
                try:
                    msg = self.from_engine.recv()
                except EOFError:
                    break
                if isinstance(msg, Ready):
                    return msg
                if isinstance(msg, Fatal):
                    raise EngineDeadError(f"engine failed to start:\n{msg.message}")
            elif not self.process.is_alive():
                break
        self.process.kill()
        raise EngineDeadError(f"engine failed to start (exit code {self.process.exitcode})")


def spawn_engine(config: EngineConfig) -> SpawnedEngine:
    """Start the engine-core process; it loads the model while the caller goes on."""
    ctx = mp.get_context("spawn")  # fork would copy torch's thread pools and locks
    to_engine_r, to_engine_w = ctx.Pipe(duplex=False)
    from_engine_r, from_engine_w = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_engine_main,
        args=(config, to_engine_r, from_engine_w),
        name="surge-engine-core",
        daemon=True,  # never outlive the API process
    )
    process.start()
    to_engine_r.close()
    from_engine_w.close()
    return SpawnedEngine(process, to_engine_w, from_engine_r)


def _engine_main(config: EngineConfig, inbox: Connection, outbox: Connection) -> None:
    _die_with_parent()  # first: the imports and the model's load below take seconds to minutes
    from surge.engine.core.process import run_engine_core  # torch and the model: child only

    run_engine_core(config, inbox, outbox)


def _die_with_parent() -> None:
    """Have the kernel kill this process when the API process dies, however it dies.

    The engine ignores SIGTERM (the API process drains, then tells it to stop), so
    multiprocessing's terminate() at the API process's exit cannot end it, and an API process
    killed outright runs no exit code at all: an engine still loading ran on, orphaned, until its
    load ended. PR_SET_PDEATHSIG (Linux) is the kernel's own guarantee; elsewhere the pipe's EOF
    ends the engine once it serves.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = mp.parent_process()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent.pid:  # it died before prctl took
        os._exit(1)
