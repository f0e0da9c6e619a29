"""Time to first token and throughput, Surge against llama.cpp's llama-server, in one run.

    python benchmarks/bench_ttft_llamacpp.py [--lengths 128,1024,4096] [--concurrency 1,16]
        [--rounds 3] [--streams 64] [--work /tmp/surge-llamacpp] [-- extra surge serve flags]

llama.cpp is built and its Q4_0 model made as benchmarks/bench_llamacpp.sh does (that script
with BUILD_ONLY=1 builds it, for this CPU; this one runs that first), and run at its
strongest for each part: one KV cache per slot (--no-kv-unified), as many slots as concurrent
requests, its prompt cache on (a slot keeps its last prompt's K/V and the server sends a request
to the slot with the longest common prefix). Both serve the same GGUF (SmolLM2-135M-Instruct).

TTFT: for each prompt length and concurrency, `c` streamed chat requests of fresh random words
(nothing cached) sent at once, then the same `c` prompts with a few words more (their prefix
cached); TTFT is from sending to the first chunk with text. The two servers alternate round by
round; each server's turn starts `--settle` seconds after the other's last answer (llama.cpp's
threads poll for work a while after a batch, by default, and would take the CPU from a request
sent at once). Throughput: `surge bench sweep` at `--streams` concurrent streams (128 prompt
and 128 output tokens), a llama-server with that many slots. Medians, and llama.cpp/Surge
ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_cached_ttft import WORDS, text_of  # noqa: E402

from tests.servers import free_port, stop_process, wait_healthy  # noqa: E402


class Proc:
    """A server process on 127.0.0.1, healthy or an error; stopped by its PID."""

    def __init__(self, name: str, cmd: list[str], port: int, timeout_s: float = 600) -> None:
        self.name, self.url = name, f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (open while it runs)
            prefix=f"ttft-{name}-", suffix=".log", delete=False
        )
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        why = wait_healthy(self.proc, self.url, timeout_s)
        if why is not None:
            self.stop()
            raise SystemExit(f"{name} {why}; log {self.log.name}")

    def stop(self) -> None:
        stop_process(self.proc, 60)


def ttft(client: httpx.Client, url: str, content: str) -> float:
    """Seconds from sending a streamed chat request to its first chunk with text."""
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,  # both servers take it: a token of text, not an end, comes first
        "stream": True,
    }
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is not None or not line.startswith("data:") or "[DONE]" in line:
                continue
            choices = json.loads(line[5:]).get("choices") or [{}]
            # The first token: text, or a chunk that ends the answer (a token with no text).
            if (choices[0].get("delta") or {}).get("content") or choices[0].get("finish_reason"):
                first = time.perf_counter() - t0
    if first is None:
        raise SystemExit(f"no token in an answer from {url} to {len(content)} characters")
    return first


def at_once(url: str, prompts: list[str]) -> list[float]:
    with httpx.Client(timeout=900) as client, ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: ttft(client, url, p), prompts))


def llamacpp(work: Path, gguf: Path, slots: int, ctx_per_slot: int) -> Proc:
    port = free_port()
    cmd = [str(work / "build/bin/llama-server"), "-m", str(gguf), "--host", "127.0.0.1",
           "--port", str(port), "-np", str(slots), "--no-kv-unified", "-c",
           str(slots * ctx_per_slot), "-t", str(os.cpu_count()), "--cont-batching"]  # fmt: skip
    return Proc("llama.cpp", cmd, port)


def throughput(url: str, streams: int, tokenizer: Path, out: Path) -> dict[str, float]:
    subprocess.run(
        [sys.executable, "-m", "surge.cli", "bench", "sweep", "--url", url, "--concurrency",
         str(streams), "--requests-per-client", "2", "--input-len", "128", "--output-len", "128",
         "--tokenizer", str(tokenizer), "--output", str(out)],
        check=True, cwd=ROOT, capture_output=True,
    )  # fmt: skip
    report = json.loads(out.read_text())["rows"][0]["summary"]
    return {
        "output_tok_s": round(report["output_tok_s"], 1),
        "ttft_p50_ms": round(report["ttft"]["p50"] * 1e3, 1),
        "errors": report["num_errors"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="128,1024,4096")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-words", type=int, default=8)
    ap.add_argument("--streams", type=int, default=64, help="0: no throughput part")
    ap.add_argument("--settle", type=float, default=0.5, help="seconds between the servers' turns")
    ap.add_argument("--work", type=Path, default=Path("/tmp/surge-llamacpp"))
    ap.add_argument("extra", nargs="*", help="surge serve flags, after --")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    work = args.work
    # Builds llama.cpp where it is missing or was built for another CPU (else a no-op), and
    # prints the build's flags: on an AMX CPU, AVX-512 without AMX (see that script).
    env = {**os.environ, "BUILD_ONLY": "1", "LLAMACPP_WORK": str(work)}
    subprocess.run(["bash", "benchmarks/bench_llamacpp.sh"], check=True, cwd=ROOT, env=env)
    from surge.models.formats.resolve import resolve_model

    gguf = Path(resolve_model("smollm2-135m"))
    q40 = work / "SmolLM2-135M-Instruct.Q4_0.gguf"
    if not q40.exists():
        subprocess.run([str(work / "build/bin/llama-quantize"), "--allow-requantize", str(gguf),
                        str(q40), "Q4_0"], check=True, capture_output=True)  # fmt: skip
    tok = work / "tokenizer.json"
    if not tok.exists():
        from surge.models.formats.model_files import open_model

        open_model(str(gguf)).tokenizer.backend.save(str(tok))
    port = free_port()
    surge = Proc("surge", [sys.executable, "-m", "surge.cli", "serve", "--model", str(gguf),
                           "--port", str(port), "--max-num-seqs", str(max(64, args.streams)),
                           *args.extra], port)  # fmt: skip
    times: dict[tuple[str, int, int, str], list[float]] = {}
    results: dict[str, dict[str, float]] = {}
    rng = random.Random(0)
    try:
        ctx = max(lengths) + 256
        llama = llamacpp(work, q40, max(levels), ctx)
        servers = {"surge": surge.url, "llama.cpp": llama.url}
        with httpx.Client(timeout=900) as client:
            for url in servers.values():
                ttft(client, url, "Hello there, warming up.")
            for rnd in range(args.rounds):
                order = list(servers.items())[:: 1 if rnd % 2 == 0 else -1]
                for length in lengths:
                    for c in levels:
                        for name, url in order:
                            tag = f"{rnd} {name} {length} {c}"
                            bases = [f"{tag} {i} " + text_of(length, surge, client, rng)
                                     for i in range(c)]  # fmt: skip
                            tail = " " + " ".join(rng.choice(WORDS) for _ in range(args.new_words))
                            time.sleep(args.settle)  # the other server's threads idle again
                            times.setdefault((name, length, c, "uncached"), []).extend(
                                at_once(url, bases)
                            )
                            times.setdefault((name, length, c, "cached"), []).extend(
                                at_once(url, [b + tail for b in bases])
                            )
        llama.stop()
        if args.streams:
            tmp = Path(tempfile.mkdtemp(prefix="ttft-sweep-"))
            llama = llamacpp(work, q40, args.streams, 320)
            results["llama.cpp"] = throughput(llama.url, args.streams, tok, tmp / "llamacpp.json")
            llama.stop()
            results["surge"] = throughput(surge.url, args.streams, tok, tmp / "surge.json")
    finally:
        surge.stop()
        if "llama" in locals():
            llama.stop()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    rows = []
    print("TTFT medians (ms), llama.cpp / Surge in brackets:")
    for length in lengths:
        for c in levels:
            for kind in ("uncached", "cached"):
                s, ll = med[("surge", length, c, kind)], med[("llama.cpp", length, c, kind)]
                rows.append({"length": length, "concurrency": c, "kind": kind,
                             "surge_ms": round(s, 1), "llamacpp_ms": round(ll, 1)})  # fmt: skip
                print(f"  {length:5d} tokens x{c:<3d} {kind:8s}: surge {s:8.1f}  llama.cpp "
                      f"{ll:8.1f}  ({ll / s:.2f}x)")  # fmt: skip
    for name, r in results.items():
        print(f"{args.streams} streams, {name}: {r}")
    print(json.dumps({"ttft": rows, "throughput": results}))


if __name__ == "__main__":
    main()
