"""`surge` command line: argparse -> config dataclasses. The only reader of the environment."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence

from surge.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=os.environ.get("SURGE_MODEL", "smollm2-135m"))
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device", default="auto")
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kv-cache-memory-gib", type=float, default=2.0)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=512)
    g.add_argument("--scheduling-policy", default="fcfs")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--no-kernels", action="store_true", help="torch ops only (no compiled CPU attention)"
    )


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=ModelConfig(
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            max_model_len=args.max_model_len,
            seed=args.seed,
            use_kernels=not args.no_kernels,
        ),
        cache=CacheConfig(
            block_size=args.block_size,
            kv_cache_memory_gib=args.kv_cache_memory_gib,
            num_blocks=args.num_kv_blocks,
            enable_prefix_caching=not args.no_prefix_caching,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            policy=args.scheduling_policy,
        ),
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
    outs = llm.generate(texts, params)
    dt = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    for p, o in zip(prompts, outs, strict=True):
        print(f"\n>>> {p}\n{o.outputs[0].text.strip()}  [{o.outputs[0].finish_reason}]")
    print(f"\n{len(outs)} requests, {n_out} tokens in {dt:.2f}s ({n_out / dt:.1f} tok/s)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="surge", description="Serve LLMs to many users at once.")
    parser.add_argument("--log-level", default=os.environ.get("SURGE_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="offline generation demo on the default model")
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--no-chat", dest="chat", action="store_false", help="raw prompts")
    gen.set_defaults(func=cmd_generate)

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s"
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
