"""Run the server: start the engine process, serve HTTP, drain on SIGTERM, die with the engine.

SIGTERM / Ctrl-C: stop admitting (503), let in-flight requests finish within the drain timeout,
then exit 0. A second signal exits at once. If the engine process dies, in-flight requests get an
error, /health turns 503 and the server exits 1 so that a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import uvicorn

from surge.batch.service import BatchService
from surge.engine.client.client import AsyncEngineClient
from surge.engine.client.spawn import SpawnedEngine
from surge.engine.config import EngineConfig
from surge.http.draining_server import DrainingServer
from surge.models.formats.generation_config import sampling_defaults
from surge.models.formats.model_files import open_model
from surge.models.formats.resolve import resolve_model
from surge.observability.embedding_metrics import EmbeddingMetrics
from surge.observability.metrics import ServerMetrics
from surge.observability.resources import ResourceMonitor
from surge.observability.tracing import Tracing
from surge.sampling_params import SamplingParams
from surge.server.app import build_app
from surge.server.batch_api import open_batch_service
from surge.server.config import ServerConfig
from surge.server.embeddings import EmbeddingService
from surge.server.monitor import LiveMonitor
from surge.server.queue_wait import EngineShape
from surge.server.state import ServerState

log = logging.getLogger(__name__)


async def _drain_on_signal(
    server: DrainingServer, state: ServerState, batch: BatchService | None
) -> None:
    await server.drain_requested.wait()
    state.admission.start_draining()
    state.batch_admission.start_draining()
    if batch is not None:  # its lines in flight stop here and run again at the next start
        await batch.stop()
    timeout = state.config.limits.drain_timeout_s
    log.info("draining: %d requests in flight, up to %.0fs", state.in_flight, timeout)
    deadline = time.monotonic() + timeout
    while state.in_flight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if state.in_flight:
        log.warning("drain timeout: %d requests still in flight", state.in_flight)
    server.should_exit = True


async def _exit_on_engine_death(server: DrainingServer, state: ServerState) -> None:
    await state.client.wait_dead().wait()
    log.error("engine died (%s): exiting", state.client.dead_reason)
    state.metrics.set_health(False)
    state.admission.set_ready(False)
    await asyncio.sleep(0.5)  # let in-flight responses carry their errors out
    server.should_exit = True


def _load_embeddings(config: ServerConfig, metrics: ServerMetrics) -> EmbeddingService | None:
    """The embedding model and its batcher, started on the running loop; None when not asked."""
    if config.embeddings.model is None:
        return None
    # Imported here: a server without embeddings never loads torch into the API process.
    from surge.models.embedding import EmbeddingModel

    path = resolve_model(config.embeddings.model)
    model = EmbeddingModel.load(path)
    name = config.embeddings.model_name or config.embeddings.model
    batcher = config.embeddings.batcher
    service = EmbeddingService(model, name, batcher, EmbeddingMetrics(name, metrics.registry))
    service.start()
    log.info(
        "embeddings: %s as %r (%s); batches of up to %d, preferred %s, max queue delay %.1f ms",
        path,
        name,
        model.describe(),
        batcher.max_batch_size,
        list(batcher.preferred_batch_sizes) or "none",
        batcher.max_queue_delay_s * 1e3,
    )
    return service


def _sampling_defaults(config: ServerConfig, model_path: Path) -> dict[str, float]:
    """The model's recommended sampling (or --generation-config's), logged as vLLM does."""
    try:
        found = sampling_defaults(
            model_path,
            config.generation.generation_config,
            config.generation.override_generation_config,
        )
        SamplingParams(**found)  # type: ignore[arg-type]  # out of range: refused at start
    except ValueError as e:
        raise SystemExit(f"generation config: {e}") from None
    if found:
        log.info(
            "defaults for the sampling fields a request leaves out (--generation-config "
            "vllm to ignore the model's): %s",
            found,
        )
    return {k: float(v) for k, v in found.items()}


async def serve(
    server_config: ServerConfig, engine_config: EngineConfig, engine: SpawnedEngine
) -> int:
    """Run until drained or the engine dies; returns the process exit code. `engine`: its
    process, spawned (spawn_engine) before this module was imported, so that the two starts
    overlap."""
    path = resolve_model(engine_config.model.model)
    defaults = _sampling_defaults(server_config, path)  # a bad one stops us (and the engine)
    # The tokenizer loads while the engine loads the weights.
    tokenizer = open_model(path).tokenizer
    if server_config.chat.chat_template is not None:
        tokenizer.chat_template = server_config.chat.chat_template
    client = await AsyncEngineClient.connect(engine, tokenizer)
    log.info(
        "engine ready (pid %s): %s, %s on %s, context %d",
        client.pid,
        path.name,
        client.info.dtype,
        client.info.device,
        client.max_model_len,
    )
    if server_config.api_niceness:
        # After the engine's start, so that it keeps the priority it was started with. (On
        # Linux this is the calling thread's: the event loop's, and threads it starts later.)
        log.info("API process niceness %d", os.nice(server_config.api_niceness))
    metrics = ServerMetrics(server_config.served_model_name, max_model_len=client.max_model_len)
    pids = {"api": os.getpid(), "engine": client.pid}
    resources = ResourceMonitor(pids)
    resources.register(metrics.registry)
    metrics.set_health(True)
    embeddings = _load_embeddings(server_config, metrics)
    tracing = Tracing.start(server_config.observability.tracing)
    state = ServerState.create(server_config, client, metrics, embeddings, tracing)
    state.sampling_defaults = defaults
    sched = engine_config.scheduler
    kv_tokens = client.info.num_blocks * client.info.block_size
    state.admission.shape = EngineShape(
        sched.max_num_seqs, sched.max_num_batched_tokens, kv_tokens, sched.policy
    )
    if state.tool_parser is not None:
        log.info(
            'tool_choice "auto": %s tool calls, %s',
            state.tool_parser.name,
            "as the chat template renders tools"
            if state.template_renders_tools
            else "taught in the system message (the chat template renders no tools)",
        )
    app = build_app(state)
    app.state.monitor = monitor = LiveMonitor(client, metrics, pids, resources.gpus)
    batch = open_batch_service(state, app)  # /v1/files, /v1/batches (surge/batch)
    uv_config = uvicorn.Config(
        app,
        host=server_config.host,
        port=server_config.port,
        log_level="warning",
        access_log=server_config.observability.log_requests,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=30,
    )
    server = DrainingServer(uv_config)
    tasks = [
        asyncio.create_task(_drain_on_signal(server, state, batch)),
        asyncio.create_task(_exit_on_engine_death(server, state)),
        asyncio.create_task(monitor.run()),  # the bottleneck, /dashboard's figures
    ]
    log.info(
        "serving %s on http://%s:%d",
        server_config.served_model_name,
        server_config.host,
        server_config.port,
    )
    try:
        await server.serve()
    finally:
        for t in tasks:
            t.cancel()
        engine_dead = client.dead_reason is not None
        if batch is not None:
            await batch.close()
        if embeddings is not None:
            await embeddings.close()
        await client.shutdown()
        tracing.shutdown()
    return 1 if engine_dead else 0
