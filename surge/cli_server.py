"""`surge serve`'s HTTP-side flags -> ServerConfig (the engine's flags are in cli.py)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from surge.batching.config import BatcherConfig
from surge.observability.tracing import (
    PROTOCOLS,
    TracingConfig,
    endpoint_from_env,
    protocol_from_env,
)
from surge.server.config import ServerConfig
from surge.server.reasoning import PARSERS as REASONING_PARSERS
from surge.server.tool_parsers import PARSERS


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", default=None, help="defaults to --model")
    g.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="require this key (repeatable); default from SURGE_API_KEY",
    )
    g.add_argument("--max-queued-requests", type=int, default=1024)
    g.add_argument("--max-queued-tokens", type=int, default=None)
    g.add_argument(
        "--max-queued-requests-per-tenant",
        type=int,
        default=None,
        help="queued requests one tenant may hold (default: only the shared bound)",
    )
    g.add_argument("--tenant-header", default="x-surge-tenant", help="header naming the tenant")
    g.add_argument(
        "--priority-header", default="x-surge-priority", help="header giving the priority"
    )
    g.add_argument("--requests-per-minute", type=int, default=None, help="per API key")
    g.add_argument("--tokens-per-minute", type=int, default=None, help="per API key")
    g.add_argument("--request-timeout", type=float, default=600.0, help="seconds; 0 = none")
    g.add_argument(
        "--max-queue-wait",
        type=float,
        default=None,
        help="seconds: refuse (429) a request whose estimated wait for its first token is "
        "longer, and shed one still without it by then (default: --request-timeout, at most "
        "30; 0 = no bound, only the count caps)",
    )
    g.add_argument("--drain-timeout", type=float, default=30.0, help="seconds")
    g.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    g.add_argument("--default-max-tokens", type=int, default=None)
    g.add_argument(
        "--generation-config",
        default="auto",
        help="defaults for the sampling fields a request leaves out: auto (the model's "
        "generation_config.json or GGUF sampling keys), vllm (none), or a folder",
    )
    g.add_argument(
        "--override-generation-config",
        type=_json_object,
        default={},
        help="JSON, e.g. '{\"temperature\": 0.7}': set on top of --generation-config",
    )
    g.add_argument("--log-requests", action="store_true")
    g.add_argument(
        "--allow-runtime-lora-updating",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter",
    )
    t = p.add_argument_group("chat template and tool calls")
    t.add_argument("--chat-template", default=None, help="a Jinja file (or text) to use instead "
                   "of the model's own chat template")  # fmt: skip
    t.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='serve tool_choice "auto" (the default when a request has tools): the model may '
        "answer or call tools, read back from its own syntax",
    )
    t.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(PARSERS),
        help="that syntax (default: the one the chat template teaches, else hermes, which the "
        "system prompt then teaches)",
    )
    t.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(REASONING_PARSERS),
        help="read a reasoning model's <think>...</think> apart from its answer, as the "
        "message's `reasoning` (qwen3: where the thinking is opened; deepseek_r1: from the start)",
    )
    g.add_argument(
        "--responses-store-max",
        type=int,
        default=1000,
        help="Responses API: keep this many responses for previous_response_id and "
        "GET /v1/responses/{id} (least recently used go first; 0: store none)",
    )
    g.add_argument(
        "--api-niceness",
        type=int,
        default=0,
        help="lower the API process's CPU priority by this much once the engine has started "
        "(the engine keeps its own): lower one-stream latency on a box of few cores",
    )
    add_tracing_args(g)
    e = p.add_argument_group("embeddings (/v1/embeddings, Triton-style dynamic batching)")
    e.add_argument(
        "--embedding-model",
        default=None,
        help="serve /v1/embeddings with this model: all-minilm-l6-v2 or a sentence-transformers "
        "folder (default: none)",
    )
    e.add_argument("--embedding-model-name", default=None, help="defaults to --embedding-model")
    e.add_argument("--embedding-max-batch-size", type=int, default=32)
    e.add_argument(
        "--embedding-preferred-batch-sizes",
        default="",
        help="comma-separated sizes sent at once when reached, e.g. 8,16 (default: none)",
    )
    e.add_argument(
        "--embedding-max-queue-delay-ms",
        type=float,
        default=0.0,
        help="longest an input waits for a fuller batch (default 0: inputs that arrive while "
        "a batch runs make the next batch; a delay only adds latency to a busy model)",
    )
    e.add_argument("--embedding-max-queue-size", type=int, default=1024, help="inputs waiting")
    e.add_argument(
        "--embedding-max-batch-tokens",
        type=int,
        default=None,
        help="bound on a batch's tokens (default: none)",
    )


def add_tracing_args(g: argparse._ActionsContainer) -> None:
    g.add_argument(
        "--otlp-traces-endpoint",
        default=endpoint_from_env(),
        help="send OpenTelemetry spans over OTLP to this collector, e.g. "
        "http://127.0.0.1:4318 (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else off)",
    )
    g.add_argument(
        "--otlp-traces-protocol",
        default=protocol_from_env(),
        choices=PROTOCOLS,
        help="http/protobuf (a collector's port 4318) or grpc (4317) "
        "(default: $OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else http/protobuf)",
    )


def server_config(args: argparse.Namespace) -> ServerConfig:
    keys = args.api_key or (
        [os.environ["SURGE_API_KEY"]] if os.environ.get("SURGE_API_KEY") else []
    )
    return ServerConfig(
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name or args.model,
        api_keys=frozenset(keys),
        max_queued_requests=args.max_queued_requests,
        max_queued_tokens=args.max_queued_tokens,
        max_queued_requests_per_tenant=args.max_queued_requests_per_tenant,
        tenant_header=args.tenant_header.lower(),
        priority_header=args.priority_header.lower(),
        requests_per_minute=args.requests_per_minute,
        tokens_per_minute=args.tokens_per_minute,
        request_timeout_s=args.request_timeout or None,
        max_queue_wait_s=args.max_queue_wait,
        drain_timeout_s=args.drain_timeout,
        max_body_bytes=args.max_body_bytes,
        default_max_tokens=args.default_max_tokens,
        generation_config=args.generation_config,
        override_generation_config=args.override_generation_config,
        log_requests=args.log_requests,
        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        chat_template=_chat_template(args.chat_template),
        responses_store_max=args.responses_store_max,
        reasoning_parser=args.reasoning_parser,
        api_niceness=args.api_niceness,
        embedding_model=args.embedding_model,
        embedding_model_name=args.embedding_model_name,
        embedding_batcher=BatcherConfig(
            max_batch_size=args.embedding_max_batch_size,
            preferred_batch_sizes=_int_list(args.embedding_preferred_batch_sizes),
            max_queue_delay_s=args.embedding_max_queue_delay_ms / 1e3,
            max_queue_size=args.embedding_max_queue_size,
            max_batch_cost=args.embedding_max_batch_tokens,
        ),
        tracing=TracingConfig(
            otlp_endpoint=args.otlp_traces_endpoint,
            otlp_protocol=args.otlp_traces_protocol,
            service_name="surge-server",
            instance_id=f"{args.host}:{args.port}",
        ),
    )


def _chat_template(value: str | None) -> str | None:
    """--chat-template: a file's text, or the value itself when it is Jinja, not a path."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if "{" not in value:
        raise SystemExit(f"--chat-template: no such file {value!r}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from None


def _json_object(text: str) -> dict[str, object]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value
