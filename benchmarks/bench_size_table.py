"""The seed's table by model size: Surge beside llama.cpp's llama-server on the same GGUF.

    python benchmarks/bench_size_table.py FILE.gguf [--label 1B-Q4_0] [--levels 1,16,64]
        [--ttft-length 1024] [--ttft-rounds 2] [--only surge|llama.cpp] [--surge-args "..."]

For each server in turn (llama.cpp first, then Surge; never both at once), on 127.0.0.1:
- start to ready: process start to the first healthy /health (warm page cache: the file is
  read once before the first start);
- resident memory at ready (the server's process tree, RSS), beside the file's bytes;
- one stream: `surge bench sweep --concurrency 1` (100-token prompts, 64 tokens out, streamed);
- uncached TTFT of a `--ttft-length`-token prompt, alone, fresh random words each round;
- N streams for each other level: `surge bench sweep --concurrency N`, one request per client.

llama.cpp runs at its strongest for each part, as bench_ttft_llamacpp.py runs it: one slot for
the one-stream and TTFT parts, then a server with one slot a stream (--no-kv-unified) for the
multi-stream levels, all cores. Surge runs one `surge serve` with --max-num-seqs at the top
level and --max-queue-wait 3600 (its admission would refuse requests predicted to wait past
its default bound; llama-server queues them all, and a throughput row counts every request
served). Files with a real model's shapes and random weights (benchmarks/make_shape_gguf.py) are
an honest speed test: speed depends on shapes, not values. Prints a markdown row per level and
one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_cached_ttft import WORDS  # noqa: E402
from bench_ttft_llamacpp import Proc, ttft  # noqa: E402

from tests.servers import free_port  # noqa: E402


def tree_rss_mib(pid: int) -> float:
    """Resident MiB of a process and its children (Surge's engine is a child process)."""
    root = psutil.Process(pid)
    total = 0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total / 2**20


def started(name: str, cmd: list[str], port: int) -> tuple[Proc, float, float]:
    t0 = time.perf_counter()
    proc = Proc(name, cmd, port, timeout_s=1200)
    ready = time.perf_counter() - t0
    time.sleep(2.0)  # let background page building settle before reading RSS
    return proc, ready, tree_rss_mib(proc.proc.pid)


def sweep(url: str, level: int, per_client: int, tok: Path, in_len: int, out_len: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="size-table-")) / "sweep.json"
    subprocess.run(
        [sys.executable, "-m", "surge.cli", "bench", "sweep", "--url", url, "--concurrency",
         str(level), "--requests-per-client", str(per_client), "--input-len", str(in_len),
         "--output-len", str(out_len), "--tokenizer", str(tok), "--output", str(out)],
        check=True, cwd=ROOT, capture_output=True,
    )  # fmt: skip
    s = json.loads(out.read_text())["rows"][0]["summary"]
    return {
        "output_tok_s": round(s["output_tok_s"], 2),
        "ttft_p50_s": round(s["ttft"]["p50"], 3),
        "tpot_p50_ms": None if s["tpot"]["p50"] is None else round(s["tpot"]["p50"] * 1e3, 1),
        "errors": s["num_errors"],
    }


def prompt_of(tokens: int, tok_file: Path, rng: random.Random) -> str:
    """Random words cut to `tokens` tokens by the shared tokenizer (both servers use the
    file's tokenizer; the chat template adds a few)."""
    from tokenizers import Tokenizer

    t = Tokenizer.from_file(str(tok_file))
    words = " ".join(rng.choice(WORDS) for _ in range(tokens * 2))
    ids = t.encode(words, add_special_tokens=False).ids[:tokens]
    return t.decode(ids)


def run_server(name: str, args: argparse.Namespace, tok: Path, levels: list[int]) -> dict:
    gguf = str(args.file)
    top = max(levels)
    res: dict = {}
    rng = random.Random(hash(name) & 0xFFFF)

    def llama_cmd(port: int, slots: int, ctx: int) -> list[str]:
        return [str(args.work / "build/bin/llama-server"), "-m", gguf, "--host", "127.0.0.1",
                "--port", str(port), "-np", str(slots), "--no-kv-unified", "-c", str(slots * ctx),
                "-t", str(os.cpu_count()), "--cont-batching"]  # fmt: skip

    port = free_port()
    if name == "llama.cpp":
        cmd = llama_cmd(port, 1, args.ttft_length + 512)
    else:
        cmd = [sys.executable, "-m", "surge.cli", "serve", "--model", gguf, "--port", str(port),
               "--max-num-seqs", str(top), *args.extra]  # fmt: skip
    proc, ready, rss = started(name, cmd, port)
    res["ready_s"], res["rss_mib"] = round(ready, 2), round(rss, 1)
    print(f"{name}: ready in {ready:.2f} s, RSS {rss:.0f} MiB", flush=True)
    try:
        with httpx.Client(timeout=1800) as client:
            ttft(client, proc.url, "Hello there, warming up.")
            if 1 in levels:
                one = sweep(proc.url, 1, args.one_requests, tok, args.input_len, args.output_len)
                res["1"] = one
                print(f"{name}: 1 stream {res['1']}", flush=True)
            if args.ttft_rounds:
                times = []
                for i in range(args.ttft_rounds):
                    time.sleep(args.settle)
                    prompt = f"{i} " + prompt_of(args.ttft_length, tok, rng)
                    times.append(ttft(client, proc.url, prompt))
                res["ttft_uncached_s"] = round(statistics.median(times), 3)
                res["ttft_all_s"] = [round(t, 3) for t in times]
                print(f"{name}: TTFT {args.ttft_length} tokens {times}", flush=True)
        multi = [lv for lv in levels if lv > 1]
        if multi and name == "llama.cpp":
            proc.stop()
            port = free_port()
            proc = Proc(name, llama_cmd(port, top, args.input_len + args.output_len + 256), port)
        for lv in multi:
            res[str(lv)] = sweep(proc.url, lv, 1, tok, args.input_len, args.output_len)
            print(f"{name}: {lv} streams {res[str(lv)]}", flush=True)
    finally:
        proc.stop()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", type=Path)
    ap.add_argument("--label", default=None)
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--one-requests", type=int, default=6, help="requests at one stream")
    ap.add_argument("--input-len", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--ttft-length", type=int, default=1024)
    ap.add_argument("--ttft-rounds", type=int, default=2, help="0: no TTFT part")
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--only", choices=["surge", "llama.cpp"], default=None)
    ap.add_argument("--work", type=Path, default=Path("/tmp/surge-llamacpp"))
    # Surge's admission refuses (429) requests whose predicted wait passes its bound, where
    # llama-server queues everything: for a throughput comparison every request is served.
    ap.add_argument("--surge-args", default="--max-queue-wait 3600", help="surge serve flags")
    args = ap.parse_args()
    args.extra = shlex.split(args.surge_args)
    levels = [int(x) for x in args.levels.split(",") if x]
    env = {**os.environ, "BUILD_ONLY": "1", "LLAMACPP_WORK": str(args.work)}
    subprocess.run(["bash", "benchmarks/bench_llamacpp.sh"], check=True, cwd=ROOT, env=env)
    tok = Path(tempfile.mkdtemp(prefix="size-table-tok-")) / "tokenizer.json"
    from surge.models.formats.model_files import open_model

    open_model(str(args.file)).tokenizer.backend.save(str(tok))
    with open(args.file, "rb") as f:  # warm page cache for both starts
        while f.read(1 << 24):
            pass
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    names = [args.only] if args.only else ["llama.cpp", "surge"]
    results = {n: run_server(n, args, tok, levels) for n in names}
    size_mib = args.file.stat().st_size / 2**20
    label = args.label or args.file.name
    print(f"\n{label} ({size_mib:.0f} MiB file), CPU {cpu}")
    print("| part | Surge | llama.cpp | ratio |")
    print("|---|---|---|---|")

    def row(part: str, key, better_low: bool = False) -> None:
        s, ll = (key(results[n]) if n in results else None for n in ("surge", "llama.cpp"))
        ratio = "" if not (s and ll) else f"{(ll / s if better_low else s / ll):.2f}x"
        print(f"| {part} | {s} | {ll} | {ratio} |")

    row("start to ready (s)", lambda r: r["ready_s"], better_low=True)
    row("RSS at ready (MiB)", lambda r: r["rss_mib"], better_low=True)
    for lv in levels:
        row(f"{lv} stream(s) tok/s", lambda r, lv=lv: r.get(str(lv), {}).get("output_tok_s"))
    if args.ttft_rounds:
        row(f"TTFT {args.ttft_length} uncached (s)", lambda r: r.get("ttft_uncached_s"), True)
    print(json.dumps({"label": label, "file_mib": round(size_mib, 1), "cpu": cpu,
                      "results": results}))  # fmt: skip


if __name__ == "__main__":
    main()
