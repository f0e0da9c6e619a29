"""`surge` command line: argparse -> config dataclasses (environment: config/settings.py)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Sequence

from surge.cli.serve import add_server_args, server_config
from surge.config.flags import add_config_args, config_from_args
from surge.config.settings import settings
from surge.engine.config import EngineConfig

# torch.compile's graphs (--compile): inductor's own default cache is under /tmp, gone at
# reboot, and the five decode graphs took 505 s to build cold on 2 cores against 146 s from
# a warm cache, so they are kept beside the model files and compiled kernels. Set before torch
# is imported (torch fixes the variable then), and inherited by the engine process.
INDUCTOR_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "surge", "inductor")


ENGINE_GROUP = "engine"


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags, one argument group per part of EngineConfig (its fields' metadata)."""
    add_config_args(p, EngineConfig, ENGINE_GROUP)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return config_from_args(EngineConfig, args, ENGINE_GROUP)


def cmd_generate(args: argparse.Namespace) -> int:
    from surge.engine.llm import LLM
    from surge.sampling_params import SamplingParams

    llm = LLM(config=engine_config(args))
    prompts = args.prompt or [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "Explain continuous batching in one sentence.",
        "List three prime numbers.",
    ]
    texts = [
        llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p
        for p in prompts
    ]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    t0 = time.perf_counter()
    outs = llm.generate(texts, params, lora_name=args.lora)
    dt = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    for p, o in zip(prompts, outs, strict=True):
        print(f"\n>>> {p}\n{o.outputs[0].text.strip()}  [{o.outputs[0].finish_reason}]")
    print(f"\n{len(outs)} requests, {n_out} tokens in {dt:.2f}s ({n_out / dt:.1f} tok/s)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from surge.engine.runner.loader import capability_report
    from surge.models.formats.model_files import open_model
    from surge.models.formats.resolve import resolve_model

    config = engine_config(args)
    files = open_model(resolve_model(config.model.model))
    print(capability_report(config.model, config.cache, files, config.scheduler))
    return 0


# Batch lines run at the lowest priority, to be preempted by interactive requests; fcfs and fair
# ignore priorities, so with the Batch API on they run as their priority-aware twins, which
# order requests of equal priority (all but batch lines, unless clients send priorities) the
# same way.
BATCH_POLICIES = {"fcfs": "priority", "fair": "priority-fair"}


def _batch_policy(engine: EngineConfig, batch_api: bool) -> EngineConfig:
    policy = engine.scheduler.policy
    if not batch_api or policy not in BATCH_POLICIES:
        return engine
    logging.getLogger("surge.serve").info(
        "scheduling policy %s runs as %s, so that interactive requests preempt Batch API "
        "lines (--no-batch-api keeps %s)",
        policy,
        BATCH_POLICIES[policy],
        policy,
    )
    scheduler = dataclasses.replace(engine.scheduler, policy=BATCH_POLICIES[policy])
    return dataclasses.replace(engine, scheduler=scheduler)


def cmd_serve(args: argparse.Namespace) -> int:
    from surge.engine.client.spawn import EngineDeadError, spawn_engine
    from surge.http.event_loop import run
    from surge.models.formats.resolve import ModelNotFoundError

    try:
        server = server_config(args)
        configs = server, _batch_policy(engine_config(args), server.batch.enabled)
    except ValueError as e:  # a bad flag value: say which, without a traceback
        print(f"surge serve: {e}", file=sys.stderr)
        return 2
    # The engine starts loading the model now, while this process imports the server (FastAPI:
    # about a second) and reads the tokenizer.
    engine = spawn_engine(configs[1])
    from surge.server.launch import serve

    try:
        return run(serve(*configs, engine))
    except (ModelNotFoundError, EngineDeadError) as e:  # no model, or it cannot load: say why
        print(f"surge serve: {e}", file=sys.stderr)
        return 1


# Subcommands with their own parsers and packages: `surge bench|gateway|autoscale ...`.
def _delegated(argv: Sequence[str]) -> int | None:
    if argv and argv[0] == "bench":
        from surge.bench.cli import main as bench_main

        return bench_main(list(argv[1:]))
    if argv and argv[0] == "gateway":
        from surge.gateway.cli import main as gateway_main

        return gateway_main(list(argv[1:]))
    if len(argv) > 1 and argv[0] == "autoscale" and argv[1] in ("simulate", "recommend"):
        # Offline, and reading surge bench's traffic models: surge.fleetsim, not surge.autoscale.
        from surge.fleetsim.cli import main as fleetsim_main

        return fleetsim_main(list(argv[1:]))
    if argv and argv[0] == "autoscale":
        from surge.autoscale.cli import main as autoscale_main

        return autoscale_main(list(argv[1:]))
    if argv and argv[0] == "top":
        from surge.cli.top import main as top_main

        return top_main(list(argv[1:]))
    return None


def build_parser() -> argparse.ArgumentParser:
    """`surge`'s parser (bench, gateway, autoscale and top parse their own arguments)."""
    parser = argparse.ArgumentParser(prog="surge", description="Serve LLMs to many users at once.")
    parser.add_argument("--log-level", default=settings().log_level)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bench", help="load generator for any OpenAI-compatible server (surge bench -h)")
    sub.add_parser("gateway", help="one address for many servers (surge gateway -h)")
    sub.add_parser("top", help="live terminal view of a server or a fleet (surge top -h)")

    gen = sub.add_parser("generate", help="offline generation demo on the default model")
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--no-chat", dest="chat", action="store_false", help="raw prompts")
    gen.add_argument("--lora", default=None, help="an adapter of --lora-modules to use")
    gen.set_defaults(func=cmd_generate)

    info = sub.add_parser(
        "info", help="device, chosen precision, weight memory, KV capacity, max_num_seqs"
    )
    add_engine_args(info)
    info.set_defaults(func=cmd_info)

    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_engine_args(srv)
    add_server_args(srv)
    srv.set_defaults(func=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = _delegated(argv)
    if delegated is not None:
        return delegated
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", INDUCTOR_CACHE_DIR)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
