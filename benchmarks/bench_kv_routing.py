"""Routing by the KV blocks replicas really hold (their KV events) against round robin and the
character-chunk prefix policy, on a multi-tenant, multi-turn workload, with an oracle's hit rate.

Per policy, fresh replicas (`surge serve --num-kv-blocks N --kv-events-endpoint tcp://127.0.0.1:*`:
caches too small for the whole working set) and a fresh `surge gateway --policy P` run the same
seeded workload: T tenants, each with its own long system prompt; C conversations, each of one
tenant, of K turns whose history is a scripted transcript (the same prompts in every run, not
the model's answers); `--concurrency` clients each run whole conversations, one turn after the
other, streaming. Reported per policy: the replicas' prefix-cache hit rate (the sum over them
of vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, in tokens, over the run) and
TTFT p50/p99 (client side, first content token).

The oracle: a simulation with full knowledge. Each request, in the canonical order (the
clients' conversations interleaved turn by turn), goes to the replica whose simulated cache
serves the most of its prompt (ties: the replica given fewest requests); each simulated cache
is the engine's own BlockManager with the replicas' size (--num-kv-blocks): the same LRU and
partial-block reuse, filled with the prompt's blocks and the answer's (unique). Requests run
one at a time in it and load is ignored: a bound on what routing alone can reach (and no
restart empties its caches).

Two workloads where only events can know (both off by default):

- `--restart-at F`: once a fraction F of the requests is done, replica 0 restarts (SIGTERM,
  a drain, then the same command on the same port): its cache is empty when it is back. Its
  KV events say so (the index drops it when the connection goes); the chunk LRU still sends
  its prefixes there.
- `--gateways N`: N gateways (an HA pair behind an L4 balancer), each turn of a conversation
  sent to the next one: each chunk LRU learns only its own traffic, the events are the same
  for all.

The default run (3 policies, 24 conversations of 3 turns, 4 answer tokens: it measures prefill
hits and TTFT) is sized for under 8 min on 2 cores (the former 48 x 4 did not end in 12);
`--gateway-args '--kv-routed-ttl 0'` turns kv_aware's routed claims off (events only):

    python benchmarks/bench_kv_routing.py --model smollm2-135m
    python benchmarks/bench_kv_routing.py --model smollm2-135m --restart-at 0.4
    python benchmarks/bench_kv_routing.py --model smollm2-135m --gateways 2

A check that it runs (a few minutes, for the processes' starts; tiny figures, not results):

    python benchmarks/bench_kv_routing.py --model /path/to/tiny-hf-folder --dtype float32 \\
        --num-kv-blocks 48 --tenants 2 --conversations 4 --turns 2 --system-words 40 \\
        --user-words 8 --assistant-words 8 --concurrency 2 --max-tokens 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import Proc  # a `surge ...` subprocess on a free port, stopped by its PID

from surge.engine.core.block_manager import BlockManager  # the oracle's caches
from surge.gateway.kv_tokens import prompt_tokens  # the gateway's own tokenizing
from surge.kv_events.hashing import block_hashes

WORDS = ("latency", "cache", "token", "batch", "replica", "gateway", "prefix", "stream",
         "budget", "queue", "router", "kernel", "block", "tenant", "retry", "breaker",
         "invoice", "refund", "flight", "hotel", "policy", "account", "order")  # fmt: skip
POLICIES = ("round_robin", "prefix", "kv_aware")
Conversation = list[list[dict[str, str]]]  # each turn's full messages


# ------------------------------------------------------------------------------- workload


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def workload(args: argparse.Namespace) -> list[Conversation]:
    """Seeded: the same conversations, turn by turn, for every policy and the oracle."""
    rng = random.Random(args.seed)
    systems = [
        f"You are tenant {t}'s assistant. Follow its rules: {_text(rng, args.system_words)}"
        for t in range(args.tenants)
    ]
    out = []
    for c in range(args.conversations):
        messages = [{"role": "system", "content": rng.choice(systems)}]
        turns = []
        for k in range(args.turns):
            messages.append({"role": "user", "content": f"[{c}.{k}] {_text(rng, args.user_words)}"})
            turns.append(list(messages))
            messages.append({"role": "assistant", "content": _text(rng, args.assistant_words)})
        out.append(turns)
    return out


def canonical_order(conversations: Sequence[Conversation], clients: int) -> list[list[dict]]:
    """The requests as `clients` clients would send them in lockstep: client i takes
    conversations i, i+clients, ...; each round, every client sends its next turn."""
    queues = [list(conversations[i::clients]) for i in range(clients)]
    streams = [[turn for conv in q for turn in conv] for q in queues]
    order = []
    for step in range(max(map(len, streams), default=0)):
        order += [s[step] for s in streams if step < len(s)]
    return order


# ------------------------------------------------------------------------------- the oracle


def oracle_hit_rate(requests: Sequence[list[dict]], args: argparse.Namespace) -> float:
    """Each replica's cache is the engine's own BlockManager (its LRU, its partial-block
    reuse, --num-kv-blocks blocks); requests run one at a time, so none holds blocks while
    another is routed."""
    caches = [BlockManager(args.num_kv_blocks, args.block_size) for _ in range(args.replicas)]
    given = [0] * args.replicas
    hit = total = 0
    for n, messages in enumerate(requests):
        tokens = prompt_tokens({"messages": messages}, args.model, 1 << 30)
        assert tokens is not None
        ids = list(tokens.token_ids)
        hashes = block_hashes(ids, args.block_size)
        best = max(
            range(args.replicas), key=lambda r: (caches[r].lookup_prefix(ids, hashes), -given[r])
        )
        given[best] += 1
        total += len(ids)
        # The answer's tokens are cached too (ids no prompt has: they match nothing later).
        full = ids + [-(n * 100_000 + i) - 1 for i in range(args.max_tokens)]
        full_hashes = block_hashes(full, args.block_size)
        cache, req = caches[best], f"oracle-{n}"
        cached = cache.allocate_slots(req, len(full), ids, hashes)
        if cached is None:
            continue  # longer than the whole cache: the replica would refuse it
        hit += cached
        cache.take_copies()
        cache.cache_full_blocks(req, full, full_hashes, len(full))
        cache.free(req, full, full_hashes, len(full))
    return hit / total if total else 0.0


# ------------------------------------------------------------------------------- a run


def metric_sum(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def drive(
    gateways: Sequence[str],
    conversations: Sequence[Conversation],
    args: argparse.Namespace,
    on_done: Any = None,
) -> tuple[list[float], int]:
    """TTFTs of every turn, and the failures; each client runs whole conversations, turn k of
    its conversations going to gateway (client + k) mod N. `on_done(n)` after each request."""
    queues = [list(conversations[i :: args.concurrency]) for i in range(args.concurrency)]
    ttfts: list[float] = []
    failed = done = 0

    async def turn(http: httpx.AsyncClient, gateway: str, messages: list[dict]) -> None:
        nonlocal failed
        body = {"model": "bench", "messages": messages, "max_tokens": args.max_tokens,
                "stream": True, "temperature": 0, "ignore_eos": True}  # fmt: skip
        t0 = time.perf_counter()
        first = None
        try:
            async with http.stream("POST", gateway + "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    failed += 1
                    await r.aread()
                    return
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data: {"):
                        choices = json.loads(line[6:]).get("choices") or [{}]
                        if choices[0].get("delta", {}).get("content"):
                            first = time.perf_counter() - t0
        except httpx.HTTPError:  # a stream cut (a replica restarting under it)
            failed += 1
            return
        if first is not None:
            ttfts.append(first)

    async def client(http: httpx.AsyncClient, c: int, convs: list[Conversation]) -> None:
        nonlocal done
        for conv in convs:
            for k, messages in enumerate(conv):
                await turn(http, gateways[(c + k) % len(gateways)], messages)
                done += 1
                if on_done is not None:
                    on_done(done)

    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(http, c, q) for c, q in enumerate(queues) if q))
    return ttfts, failed


def restart(replica: Proc) -> float:
    """Stop a replica (SIGTERM: it drains) and start the same command on the same port; the
    seconds until it is healthy again."""
    t0 = time.perf_counter()
    replica.stop()
    cmd = [str(a) for a in replica.proc.args]  # type: ignore[union-attr]
    replica.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    replica.wait()
    return time.perf_counter() - t0


def run_policy(policy: str, conversations: Sequence[Conversation], args: argparse.Namespace
               ) -> dict[str, Any]:  # fmt: skip
    replicas = [
        Proc("serve", "--model", args.model, "--dtype", args.dtype, "--served-model-name",
             "bench", "--num-kv-blocks", str(args.num_kv_blocks), "--block-size",
             str(args.block_size), "--kv-events-endpoint", "tcp://127.0.0.1:*")
        for _ in range(args.replicas)
    ]  # fmt: skip
    procs = list(replicas)
    try:
        for r in replicas:
            r.wait()
        every = [a for r in replicas for a in ("--upstream", r.url)]
        gateways = [
            Proc("gateway", *every, "--policy", policy, "--kv-tokenizer", args.model,
                 "--scrape-interval", "0.25", "--health-interval", "0.5",
                 *shlex.split(args.gateway_args))
            for _ in range(args.gateways)
        ]  # fmt: skip
        procs += gateways
        for g in gateways:
            g.wait()
        time.sleep(1.0)  # the kv_aware gateway reads /version and subscribes
        urls = [r.url for r in replicas]
        # A restarted replica's counters start again from 0: what it counted before is kept.
        counted = {"hits": 0.0, "queries": 0.0}

        def count(sign: float) -> None:
            for name, metric in (("hits", "vllm:prefix_cache_hits_total"),
                                 ("queries", "vllm:prefix_cache_queries_total")):  # fmt: skip
                counted[name] += sign * sum(metric_sum(u, metric) for u in urls)

        count(-1)
        total = sum(len(c) for c in conversations)
        restarts: list[threading.Thread] = []
        restart_s: list[float] = []

        def on_done(n: int) -> None:
            if args.restart_at is not None and not restarts and n >= args.restart_at * total:

                def run() -> None:
                    counted["hits"] += metric_sum(urls[0], "vllm:prefix_cache_hits_total")
                    counted["queries"] += metric_sum(urls[0], "vllm:prefix_cache_queries_total")
                    restart_s.append(restart(replicas[0]))

                restarts.append(threading.Thread(target=run))
                restarts[0].start()

        t0 = time.perf_counter()
        ttfts, failed = asyncio.run(drive([g.url for g in gateways], conversations, args, on_done))
        elapsed = time.perf_counter() - t0
        for t in restarts:
            t.join()
        count(+1)
        hits, queries = counted["hits"], counted["queries"]
        return {
            "policy": policy,
            "hit_rate": hits / queries if queries else 0.0,
            "ttft_p50_s": pct(ttfts, 0.50),
            "ttft_p99_s": pct(ttfts, 0.99),
            "requests": len(ttfts) + failed,
            "failed": failed,
            "elapsed_s": elapsed,
            "restart_s": restart_s[0] if restart_s else None,
        }
    finally:
        for p in reversed(procs):
            p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument(
        "--num-kv-blocks", type=int, default=96, help="per replica (too few on purpose)"
    )
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--tenants", type=int, default=6)
    ap.add_argument("--system-words", type=int, default=300)
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--user-words", type=int, default=30)
    ap.add_argument("--assistant-words", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=4, help="answer tokens (TTFT is measured)")
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--restart-at", type=float, metavar="F",
                    help="restart replica 0 once this fraction of requests is done")  # fmt: skip
    ap.add_argument("--gateways", type=int, default=1,
                    help="gateways, each turn of a conversation sent to the next one")  # fmt: skip
    ap.add_argument("--gateway-args", default="",
                    help="more gateway flags, e.g. '--kv-routed-ttl 0' (claims off)")  # fmt: skip
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    conversations = workload(args)
    order = canonical_order(conversations, args.concurrency)
    oracle = oracle_hit_rate(order, args)
    rows = [run_policy(p, conversations, args) for p in args.policies.split(",")]
    print(f"{'policy':<14}{'hit rate':>10}{'of oracle':>11}{'TTFT p50 ms':>13}"
          f"{'TTFT p99 ms':>13}{'failed':>8}")  # fmt: skip
    for r in rows:
        share = r["hit_rate"] / oracle if oracle else float("nan")
        p50, p99 = r["ttft_p50_s"] * 1e3, r["ttft_p99_s"] * 1e3
        print(f"{r['policy']:<14}{r['hit_rate']:>10.3f}{share:>11.2f}"
              f"{p50:>13.1f}{p99:>13.1f}{r['failed']:>8}")  # fmt: skip
    print(f"{'oracle':<14}{oracle:>10.3f}")
    result = {"config": vars(args) | {"json": None}, "oracle_hit_rate": oracle, "policies": rows}
    print(json.dumps(result, default=str))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
