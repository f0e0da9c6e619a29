"""Time to first token through a real `surge serve`, a prompt uncached against the same prompt
again with a few new tokens after it (a prefix-cache hit), at several prompt lengths.

    python benchmarks/bench_cached_ttft.py [--lengths 128,1024,4096] [--rounds 5]
        [--new-words 8] [--against REV] [-- extra serve flags]

Each round and length sends, as a streamed chat completion of one token: a prompt of about
`length` tokens (random words, a fresh prefix each time, so nothing of it is cached), then the
same user message with `--new-words` words after it (its prefix cached; ~10 new tokens with the
template's closing ones) twice. TTFT is from sending the request to the first chunk after the
role chunk. Medians per length, and cached/uncached ratios.

`--against REV` starts a second server from a git worktree of REV (made under /tmp, kept for the
next run unless `--remove-worktree`) and alternates the two request by request, the order
flipped every round, so that the machine's drift falls on both alike; then it prints new/old
ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import free_port, stop_process, wait_healthy

ROOT = Path(__file__).resolve().parent.parent

WORDS = [
    "time",
    "person",
    "year",
    "way",
    "day",
    "thing",
    "man",
    "world",
    "life",
    "hand",
    "part",
    "child",
    "eye",
    "woman",
    "place",
    "work",
    "week",
    "case",
    "point",
    "government",
    "company",
    "number",
    "group",
    "problem",
    "fact",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
]


class Server:
    def __init__(self, tree: Path, extra: list[str], timeout_s: float = 300) -> None:
        self.tree = tree
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (open while the server runs)
            prefix="surge-ttft-", suffix=".log", delete=False
        )
        env = {**_env(), "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "surge.cli", "serve", "--port", str(self.port), *extra],
            cwd=tree, stdout=self.log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        why = wait_healthy(self.proc, self.url, timeout_s)
        if why is not None:
            self.stop()
            raise SystemExit(f"{tree}: surge serve {why}; log {self.log.name}")

    def ttft(self, client: httpx.Client, content: str) -> float:
        """Seconds from sending a streamed chat request to its first token's chunk."""
        body = {
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 1,
            "temperature": 0,
            "stream": True,
        }
        t0 = time.perf_counter()
        chunks = 0
        first = None
        with client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data:"):
                    chunks += 1
                    if chunks == 2:  # the first after the role chunk
                        first = time.perf_counter() - t0
        if first is None:
            raise SystemExit(f"no token in the answer of {self.tree}")
        return first

    def stop(self) -> None:
        stop_process(self.proc, 60)


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def text_of(length: int, server: Server, client: httpx.Client, rng: random.Random) -> str:
    """Random words whose chat rendering is about `length` tokens (calibrated once)."""
    words = [rng.choice(WORDS) for _ in range(length)]
    n = len(words)
    for _ in range(4):  # words are ~1 token each: a few proportional corrections converge
        body = {"messages": [{"role": "user", "content": " ".join(words[:n])}]}
        count = client.post(server.url + "/tokenize", json=body).json()["count"]
        if count == length:
            break
        n = max(1, n + length - count)
        words += [rng.choice(WORDS) for _ in range(max(0, n - len(words)))]
    return " ".join(words[:n])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="128,1024,4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-words", type=int, default=8, help="words after the cached prompt")
    ap.add_argument("--against", help="git revision to compare, run from a worktree")
    ap.add_argument("--remove-worktree", action="store_true", help="remove it at the end")
    ap.add_argument("extra", nargs="*", help="surge serve flags, after --")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    worktree = None
    trees = {"new": ROOT}
    if args.against:
        sha = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", args.against],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        # Kept (named by the commit) for the next run: its kernels are built once, into it.
        worktree = Path(tempfile.gettempdir()) / f"surge-against-{sha[:12]}"
        if not worktree.exists():
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), sha],
                check=True, capture_output=True,
            )  # fmt: skip
        trees["old"] = worktree
    servers: dict[str, Server] = {}
    rng = random.Random(0)
    times: dict[tuple[str, int, str], list[float]] = {}
    try:
        for name, tree in trees.items():
            servers[name] = Server(tree, args.extra)
        first = next(iter(servers.values()))
        with httpx.Client(timeout=600) as client:
            for server in servers.values():  # warm both: the first request builds things
                server.ttft(client, "Hello there, warming up.")
            for rnd in range(args.rounds):
                order = list(servers.items())
                if rnd % 2:
                    order.reverse()
                for length in lengths:
                    for name, server in order:
                        base = f"{rnd} {name} " + text_of(length, first, client, rng)
                        tail = " " + " ".join(rng.choice(WORDS) for _ in range(args.new_words))
                        uncached = server.ttft(client, base)
                        cached = [server.ttft(client, base + tail + f" {i}") for i in range(2)]
                        times.setdefault((name, length, "uncached"), []).append(uncached)
                        times.setdefault((name, length, "cached"), []).extend(cached)
    finally:
        for server in servers.values():
            server.stop()
        if worktree is not None and args.remove_worktree:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                check=False, capture_output=True,
            )  # fmt: skip
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    rows = []
    for name in trees:
        for length in lengths:
            u, c = med[(name, length, "uncached")], med[(name, length, "cached")]
            rows.append({"tree": name, "length": length, "uncached_ms": round(u, 1),
                         "cached_ms": round(c, 1), "ratio": round(u / c, 1)})  # fmt: skip
            print(f"{name:4s} {length:5d} tokens: uncached {u:8.1f} ms  cached {c:7.1f} ms "
                  f" uncached/cached {u / c:5.1f}x")  # fmt: skip
    if "old" in trees:
        for length in lengths:
            for kind in ("uncached", "cached"):
                ratio = med[("old", length, kind)] / med[("new", length, kind)]
                print(f"{length:5d} tokens {kind:8s}: old/new {ratio:.2f}x")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
