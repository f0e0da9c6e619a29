"""The engine-core process: load the model, then loop: drain the inbox, step, send outputs.

It blocks only when it has no work, so a step is never delayed by the HTTP side.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
import traceback
from multiprocessing.connection import Connection

from surge.config.settings import settings
from surge.engine.client.protocol import (
    Abort,
    AddRequests,
    Fatal,
    LoadLoRA,
    LoRAResult,
    Outputs,
    Ready,
    RequestFailed,
    Shutdown,
    ToEngine,
    UnloadLoRA,
)
from surge.engine.config import EngineConfig
from surge.engine.core.calibrate import startup, warm_up
from surge.engine.core.engine_core import EngineCore

log = logging.getLogger(__name__)


def run_engine_core(config: EngineConfig, inbox: Connection, outbox: Connection) -> None:
    """Process entry point. Exits when told to, when the API process goes away, or on error."""
    # The API process handles Ctrl-C/SIGTERM and tells us to stop; don't die mid-step on them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=settings().log_level.upper())
    try:
        try:
            engine = EngineCore(config)
        except (ValueError, OSError, MemoryError) as e:  # bad, unreadable or too big: one line
            log.error("engine could not start: %s", e)
            with contextlib.suppress(OSError, BrokenPipeError):
                outbox.send(Fatal(str(e)))
            raise SystemExit(1) from None
        # Before Ready: admission needs the step costs for a first burst. A warm-up alone (the
        # costs stored) waits until after it, but for KV events' subscribers, who would see
        # its blocks come and go.
        step_samples, warm_up_owed = startup(
            engine, config.scheduler.calibration, warm_now=config.kv_events.enabled
        )
        engine.scheduler.background.calibrate(step_samples)  # its prior for pricing steps
        try:
            kv_events = engine.start_kv_events()  # after calibration: its blocks are forgotten
        except (ValueError, OSError) as e:  # the address is taken or malformed: one line
            log.error("engine could not start: %s", e)
            with contextlib.suppress(OSError, BrokenPipeError):
                outbox.send(Fatal(str(e)))
            raise SystemExit(1) from None
        outbox.send(
            Ready(
                model_path=str(engine.files.path),
                max_model_len=engine.max_model_len,
                vocab_size=engine.files.spec.vocab_size,
                dtype=str(engine.precision.dtype).removeprefix("torch."),
                device=str(engine.precision.device),
                num_blocks=engine.plan.num_blocks,
                block_size=engine.plan.block_size,
                lora_adapters=engine.list_loras(),
                max_loras=engine.config.lora.max_loras if engine.loras is not None else 0,
                step_samples=step_samples,
                kv_events_endpoint=kv_events.endpoint if kv_events else None,
                kv_events_replay_endpoint=kv_events.replay_endpoint if kv_events else None,
                kv_events_topic=kv_events.topic if kv_events else "",
            )
        )
        if warm_up_owed:
            started = time.perf_counter()
            warm_up(engine)  # before the first message is read: no request meets it
            log.info("warmed up after ready in %.2f s", time.perf_counter() - started)
        _loop(engine, inbox, outbox)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the API process is gone
    except Exception:
        message = traceback.format_exc()
        log.error("engine core died:\n%s", message)
        with contextlib.suppress(OSError, BrokenPipeError):
            outbox.send(Fatal(message))
        raise SystemExit(1) from None


def _loop(engine: EngineCore, inbox: Connection, outbox: Connection) -> None:
    while True:
        # Block for a message only when idle; otherwise take what arrived and step.
        if not engine.has_work() or inbox.poll():
            idle_since = time.perf_counter()
            msg: ToEngine = inbox.recv()
            engine.step_stats.wait_time_s += time.perf_counter() - idle_since  # blocked: no work
            if _handle(engine, msg, outbox):
                return
            while inbox.poll():
                if _handle(engine, inbox.recv(), outbox):
                    return
        if engine.has_work():
            outputs = engine.step()
            outbox.send(Outputs(outputs, engine.stats()))
        else:
            outbox.send(Outputs([], engine.stats()))  # fresh gauges after aborts


def _handle(engine: EngineCore, msg: ToEngine, outbox: Connection) -> bool:
    """Apply one message; True means shut down."""
    if isinstance(msg, AddRequests):
        for creq in msg.requests:
            try:
                engine.add_request(creq)
            except ValueError as e:
                outbox.send(RequestFailed(creq.req_id, str(e)))
    elif isinstance(msg, Abort):
        for req_id in msg.req_ids:
            engine.abort(req_id)
    elif isinstance(msg, LoadLoRA | UnloadLoRA):
        error = None
        try:
            if isinstance(msg, LoadLoRA):
                engine.add_lora(msg.name, msg.path)
            else:
                engine.remove_lora(msg.name)
        except ValueError as e:
            error = str(e)
        outbox.send(LoRAResult(msg.call_id, error, engine.list_loras()))
    elif isinstance(msg, Shutdown):
        return True
    return False
