"""`surge` command line: argparse -> config dataclasses. The only reader of the environment."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence

from surge.cli_server import add_server_args, server_config
from surge.engine.config import (
    QUANTIZATIONS,
    SCHEDULING_POLICIES,
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)

# torch.compile's graphs (--compile): inductor's own default cache is under /tmp, gone at
# reboot, and the five decode graphs took 505 s to build cold on 2 cores against 146 s from
# a warm cache, so they are kept beside the model files and compiled kernels. Set before torch
# is imported (torch fixes the variable then), and inherited by the engine process.
INDUCTOR_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "surge", "inductor")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=os.environ.get("SURGE_MODEL", "smollm2-135m"))
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: bf16 where the device has native bf16 matmuls, else fp16 (CUDA) or fp32",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16", "int8"],
        help="auto: the model's dtype, but bf16 where auto chose float32 on a CPU; int8: "
        "a scale per token and head, half of bf16's bytes",
    )
    g.add_argument(
        "--quantization",
        default="auto",
        choices=QUANTIZATIONS,
        help="auto: a Q4_1 GGUF's own 4-bit blocks (q4) on a CPU with their kernel (AVX2 or "
        "AVX-512 VNNI), else none; int8 weights (per-channel scales; int8 picks the kernel per "
        "batch shape); q4: 4-bit blocks (GGUF Q4_1) for decode batches, int8 for larger ones",
    )
    g.add_argument("--compile", action="store_true", help="torch.compile the decode step (opt-in)")
    g.add_argument(
        "--no-fused-decode",
        action="store_true",
        help="q4: run decode steps layer by layer, not as one compiled call",
    )
    g.add_argument(
        "--batch-invariant",
        action="store_true",
        help="greedy output identical whatever else is in the batch (q4 on CPU: every step on "
        "the int8 copies; small steps slower, see docs/precision.md)",
    )
    g.add_argument(
        "--enforce-eager",
        action="store_true",
        help="GPU: run decode steps eagerly, not replayed from captured CUDA graphs",
    )
    g.add_argument("--device", default="auto")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument(
        "--kv-cache-memory-gib",
        type=float,
        default=None,
        help="memory for the KV cache (default: 2 on a CPU; on a GPU what "
        "--gpu-memory-utilization leaves after the weights)",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="GPU: the share of its memory this instance may hold (weights, KV cache, steps)",
    )
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument(
        "--scheduling-policy",
        default="fcfs",
        choices=SCHEDULING_POLICIES,
        help="fcfs; priority (lower value sooner, with aging); fair (per-tenant token share, "
        "VTC); priority-fair (priority bands, fair share within a band)",
    )
    g.add_argument(
        "--priority-aging-s",
        type=float,
        default=5.0,
        help="seconds of waiting worth one priority level (0: no aging; low priority may starve)",
    )
    g.add_argument(
        "--preemption-threshold",
        type=int,
        default=1,
        help="a waiting request may preempt running work this many priority levels less urgent "
        "when the batch is full (0: never)",
    )
    g.add_argument(
        "--tenant-weight",
        action="append",
        default=[],
        metavar="TENANT=WEIGHT",
        help="fair-share weight of a tenant (repeatable; others weigh 1)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--no-kernels", action="store_true", help="torch ops only (no compiled CPU attention)"
    )
    lora = p.add_argument_group("LoRA adapters (PEFT folders; a request names one as `model`)")
    lora.add_argument("--enable-lora", action="store_true", help="implied by --lora-modules")
    lora.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help='adapters loaded at start: NAME=PATH or {"name": ..., "path": ...}',
    )
    lora.add_argument("--max-loras", type=int, default=4, help="adapters resident at once")
    lora.add_argument("--max-lora-rank", type=int, default=16)
    g.add_argument(
        "--speculative-config",
        default=None,
        metavar="JSON",
        help='speculative decoding, vLLM\'s form: {"method": "ngram", "num_speculative_tokens": '
        '4, "prompt_lookup_min": 2, "prompt_lookup_max": 4, "disable_by_batch_size": N}',
    )


def parse_tenant_weight(text: str) -> tuple[str, float]:
    tenant, sep, weight = text.rpartition("=")
    try:
        if not sep or not tenant:
            raise ValueError
        return tenant, float(weight)
    except ValueError:
        raise SystemExit(f"--tenant-weight expects TENANT=WEIGHT, got {text!r}") from None


def parse_lora_module(text: str) -> tuple[str, str]:
    """vLLM's --lora-modules forms: name=path, or a JSON object with name and path."""
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
            return str(obj["name"]), str(obj["path"])
        except (ValueError, KeyError, TypeError):
            raise SystemExit(f"--lora-modules: bad JSON adapter {text!r}") from None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise SystemExit(f"--lora-modules expects NAME=PATH, got {text!r}")
    return name, path


def speculative_config(text: str | None) -> SpeculativeConfig:
    if not text:
        return SpeculativeConfig()
    try:
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise TypeError("not an object")
        return SpeculativeConfig(**fields)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"--speculative-config: {e}") from None


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            max_model_len=args.max_model_len,
            seed=args.seed,
            use_kernels=not args.no_kernels,
            quantization=args.quantization,
            compile=args.compile,
            fused_decode=not args.no_fused_decode,
            cuda_graphs=not args.enforce_eager,
            batch_invariant=args.batch_invariant,
        ),
        cache=CacheConfig(
            block_size=args.block_size,
            kv_cache_memory_gib=args.kv_cache_memory_gib,
            gpu_memory_utilization=args.gpu_memory_utilization,
            num_blocks=args.num_kv_blocks,
            enable_prefix_caching=not args.no_prefix_caching,
            kv_cache_dtype=args.kv_cache_dtype,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            policy=args.scheduling_policy,
            priority_aging_s=args.priority_aging_s or None,
            preemption_threshold=args.preemption_threshold or None,
            tenant_weights=tuple(parse_tenant_weight(w) for w in args.tenant_weight),
        ),
        lora=LoRAConfig(
            enable_lora=args.enable_lora,
            max_loras=args.max_loras,
            max_lora_rank=args.max_lora_rank,
            adapters=tuple(parse_lora_module(m) for m in args.lora_modules),
        ),
        speculative=speculative_config(args.speculative_config),
    )


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
    from surge.engine.loader import capability_report
    from surge.models.resolve import resolve_model
    from surge.models.weights import open_model

    config = engine_config(args)
    files = open_model(resolve_model(config.model.model))
    print(capability_report(config.model, config.cache, files, config.scheduler))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from surge.engine.spawn import spawn_engine
    from surge.event_loop import run

    try:
        configs = server_config(args), engine_config(args)
    except ValueError as e:  # a bad flag value: say which, without a traceback
        print(f"surge serve: {e}", file=sys.stderr)
        return 2
    # The engine starts loading the model now, while this process imports the server (torch,
    # FastAPI: about a second) and reads the tokenizer.
    engine = spawn_engine(configs[1])
    from surge.server.launch import serve

    return run(serve(*configs, engine))


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
        from surge.top import main as top_main

        return top_main(list(argv[1:]))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    delegated = _delegated(argv)
    if delegated is not None:
        return delegated
    parser = argparse.ArgumentParser(prog="surge", description="Serve LLMs to many users at once.")
    parser.add_argument("--log-level", default=os.environ.get("SURGE_LOG_LEVEL", "INFO"))
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

    args = parser.parse_args(argv)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", INDUCTOR_CACHE_DIR)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
