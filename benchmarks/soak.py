"""Soak: a server under a realistic mix at ~70% of its measured capacity for N minutes, sampled.

Starts `surge serve` (its own, so that both processes can be watched), measures capacity
briefly (a closed loop of --capacity-concurrency clients for --capacity-s; or --rate), then
sends Poisson arrivals at --load-fraction of it: chat and completions, streaming and not,
n=2, structured output (a JSON schema), a LoRA adapter when --lora-modules is given,
cancellations (a stream closed after a few chunks), and --tenants tenants that each share a
long system prompt (prefix caching). Every --interval-s it samples, for the API and the engine
process: RSS, open fds, threads; and the KV cache in use, the prefix cache's blocks, and the
latency percentiles of the requests finished in that interval. After the load it waits for the
server to go idle and samples once more.

Pass (each also in the JSON, with its figures):
- memory: no growth trend: each process grows by at most --rss-trend-mib over the second half
  of the run, and by at most the KV pool (--kv-cache-memory-gib, which fills as pages are first
  touched) plus --rss-trend-mib over the whole run;
- fds and threads flat: at idle after the run, at most 4 fds and 2 threads more than at idle
  before it, per process;
- KV back to zero at idle; p99 flat: the last third's median interval p99 (end to end) within
  --p99-ratio of the first third's; no request failed except the cancelled ones.

    python benchmarks/soak.py --model smollm2-135m --minutes 60 --out soak-60
    (writes soak-60.json and soak-60.png; exit status 1 when a criterion fails)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

MIB = 1024 * 1024
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@dataclass
class Done:
    kind: str
    t_end: float
    e2e_s: float
    ttft_s: float | None
    ok: bool
    status: int
    error: str = ""  # what a failed one got: its error body or event, or the exception


@dataclass
class Sample:
    t_s: float
    phase: str  # "idle-before" | "load" | "idle-after"
    rss_mib: dict[str, float] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)
    kv_usage: float = 0.0
    prefix_cache_blocks: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    finished: int = 0
    failed: int = 0
    p50_e2e_s: float | None = None
    p99_e2e_s: float | None = None
    p99_ttft_s: float | None = None


class Mix:
    """One request of the mix, drawn at random (seeded)."""

    KINDS = ("chat-stream", "chat-n2", "completion-stream", "completion", "structured",
             "cancel", "lora")  # fmt: skip

    def __init__(self, args: argparse.Namespace, rng: random.Random) -> None:
        self.args, self.rng = args, rng
        words = ["the", "of", "a", "river", "quiet", "signal", "engine", "tensor", "cache"]
        self.system = [
            f"You are assistant {t} of tenant {t}. " + " ".join(rng.choices(words, k=120))
            for t in range(args.tenants)
        ]
        self.kinds = [k for k in self.KINDS if k != "lora" or args.lora_modules]

    def draw(self, cancels: bool = True) -> tuple[str, str, dict[str, object], dict[str, str]]:
        kinds = [k for k in self.kinds if cancels or k != "cancel"]
        kind = self.rng.choice(kinds)
        tenant = self.rng.randrange(self.args.tenants)
        headers = {"x-surge-tenant": f"tenant-{tenant}"}
        max_tokens = self.rng.randint(8, self.args.max_tokens)
        user = f"Question {self.rng.randrange(10**6)}: tell me about the river."
        messages = [{"role": "system", "content": self.system[tenant]},
                    {"role": "user", "content": user}]  # fmt: skip
        model = self.args.served_model_name
        if kind == "lora":
            model = self.args.lora_modules.split("=")[0]
        body: dict[str, object] = {"model": model, "max_tokens": max_tokens}
        if kind.startswith("completion"):
            body["prompt"] = self.system[tenant] + " " + user
            return kind, "/v1/completions", {**body, "stream": kind.endswith("stream")}, headers
        body["messages"] = messages
        if kind == "chat-n2":
            body["n"] = 2
        if kind == "structured":
            body["response_format"] = {
                "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA},
            }  # fmt: skip
            body["max_tokens"] = max(body["max_tokens"], 48)  # type: ignore[call-overload]
        body["stream"] = kind in ("chat-stream", "cancel", "lora")
        return kind, "/v1/chat/completions", body, headers


async def send(
    client: httpx.AsyncClient, url: str, kind: str, path: str, body: dict[str, object],
    headers: dict[str, str],
) -> Done:  # fmt: skip
    t0 = time.monotonic()
    ttft = None
    try:
        if not body.get("stream"):
            r = await client.post(url + path, json=body, headers=headers)
            now = time.monotonic()
            ok = r.status_code == 200
            return Done(kind, now, now - t0, None, ok, r.status_code, "" if ok else r.text[:300])
        async with client.stream("POST", url + path, json=body, headers=headers) as r:
            chunks = 0
            ok = r.status_code == 200
            error = "" if ok else (await r.aread()).decode(errors="replace")[:300]
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if ttft is None:
                    ttft = time.monotonic() - t0
                if line == "data: [DONE]":
                    break
                if _is_error_event(line[6:]):  # not a chunk whose text is the word "error"
                    ok, error = False, line[:300]
                chunks += 1
                if kind == "cancel" and chunks >= 3:
                    break  # closing the stream cancels the request
            now = time.monotonic()
            return Done(kind, now, now - t0, ttft, ok, r.status_code, error)
    except httpx.HTTPError as e:
        now = time.monotonic()
        return Done(kind, now, now - t0, ttft, False, 0, repr(e)[:300])


def _is_error_event(payload: str) -> bool:
    try:
        event = json.loads(payload)
    except ValueError:
        return True  # a stream must carry JSON events: anything else is broken
    return isinstance(event, dict) and "error" in event


async def closed_loop(url: str, mix: Mix, concurrency: int, seconds: float) -> float:
    """Requests finished per second by `concurrency` clients each sending one after another."""
    stop = time.monotonic() + seconds
    done: list[Done] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            done.append(await send(client, url, *mix.draw(cancels=False)))

    async with httpx.AsyncClient(timeout=300) as client:
        t0 = time.monotonic()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.monotonic() - t0
    return sum(d.ok for d in done) / elapsed


def metric_values(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, float(s.value))
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def sample(url: str, procs: dict[str, psutil.Process], phase: str, t0: float,
           done: list[Done]) -> Sample:  # fmt: skip
    s = Sample(t_s=round(time.monotonic() - t0, 1), phase=phase)
    for name, p in procs.items():
        s.rss_mib[name] = round(p.memory_info().rss / MIB, 1)
        s.fds[name] = p.num_fds()
        s.threads[name] = p.num_threads()
    m = metric_values(url)
    s.kv_usage = m.get("vllm:kv_cache_usage_perc", 0.0)
    s.prefix_cache_blocks = m.get("surge:prefix_cache_blocks", 0.0)
    s.running = m.get("vllm:num_requests_running", 0.0)
    s.waiting = m.get("vllm:num_requests_waiting", 0.0)
    finished = [d for d in done if d.kind != "cancel"]
    s.finished = len(finished)
    s.failed = sum(not d.ok for d in finished)
    e2e = [d.e2e_s for d in finished if d.ok]
    s.p50_e2e_s, s.p99_e2e_s = percentile(e2e, 0.5), percentile(e2e, 0.99)
    s.p99_ttft_s = percentile([d.ttft_s for d in finished if d.ttft_s is not None], 0.99)
    return s


async def open_loop(
    url: str, mix: Mix, rate: float, seconds: float, interval_s: float,
    procs: dict[str, psutil.Process], t0: float,
) -> tuple[list[Sample], int, list[dict[str, object]]]:  # fmt: skip
    """Poisson arrivals at `rate` per second; a sample every `interval_s`. Returns the samples,
    the failed requests' count and the first few of them (kind, status, error)."""
    samples: list[Sample] = []
    failures: list[dict[str, object]] = []
    window: list[Done] = []
    tasks: set[asyncio.Task[Done]] = set()
    total_failed = 0
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        start = time.monotonic()
        next_arrival, next_sample = start, start + interval_s

        def collect(task: asyncio.Task[Done]) -> None:
            tasks.discard(task)
            done = task.result()
            window.append(done)
            if not done.ok and done.kind != "cancel" and len(failures) < 20:
                failures.append({"kind": done.kind, "status": done.status, "error": done.error})

        while time.monotonic() < start + seconds:
            now = time.monotonic()
            if now >= next_sample:
                s = await asyncio.to_thread(sample, url, procs, "load", t0, list(window))
                total_failed += s.failed
                window.clear()
                samples.append(s)
                print(json.dumps(asdict(s)), flush=True)
                next_sample += interval_s
            if now >= next_arrival:
                task = asyncio.create_task(send(client, url, *mix.draw()))
                tasks.add(task)
                task.add_done_callback(collect)
                next_arrival += mix.rng.expovariate(rate)
            await asyncio.sleep(max(0.0, min(next_arrival, next_sample) - time.monotonic()))
        if tasks:
            await asyncio.wait(tasks, timeout=300)
    total_failed += sum(not d.ok for d in window if d.kind != "cancel")
    return samples, total_failed, failures


def wait_idle(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = metric_values(url)
        if (
            m.get("vllm:num_requests_running", 1) == 0
            and m.get("vllm:num_requests_waiting", 1) == 0
        ):
            time.sleep(1.0)  # let the gauges settle after the last step
            return
        time.sleep(0.5)


def judge(
    samples: list[Sample], before: Sample, after: Sample, failed: int,
    args: argparse.Namespace, failures: list[dict[str, object]] | None = None,
) -> dict[str, dict[str, object]]:  # fmt: skip
    load = [s for s in samples if s.phase == "load"]
    half = load[len(load) // 2 :] or load
    out: dict[str, dict[str, object]] = {}
    pool_mib = args.kv_cache_memory_gib * 1024
    for name in before.rss_mib:
        total = after.rss_mib[name] - before.rss_mib[name]
        trend = half[-1].rss_mib[name] - half[0].rss_mib[name]
        allowed_total = args.rss_trend_mib + (pool_mib if name == "engine" else 0)
        out[f"rss_{name}"] = {
            "growth_mib": round(total, 1), "second_half_growth_mib": round(trend, 1),
            "bound_mib": allowed_total, "trend_bound_mib": args.rss_trend_mib,
            "pass": total <= allowed_total and trend <= args.rss_trend_mib,
        }  # fmt: skip
        fds = after.fds[name] - before.fds[name]
        threads = after.threads[name] - before.threads[name]
        out[f"fds_{name}"] = {"idle_before": before.fds[name], "idle_after": after.fds[name],
                              "pass": fds <= 4}  # fmt: skip
        out[f"threads_{name}"] = {
            "idle_before": before.threads[name], "idle_after": after.threads[name],
            "pass": threads <= 2,
        }  # fmt: skip
    out["kv_idle"] = {"kv_usage_after": after.kv_usage, "pass": after.kv_usage == 0.0}
    p99 = [s.p99_e2e_s for s in load if s.p99_e2e_s is not None]
    third = max(1, len(p99) // 3)
    first, last = statistics.median(p99[:third] or [0]), statistics.median(p99[-third:] or [0])
    out["p99_flat"] = {
        "first_third_s": round(first, 3), "last_third_s": round(last, 3),
        "ratio_bound": args.p99_ratio, "pass": bool(p99) and last <= args.p99_ratio * first,
    }  # fmt: skip
    out["no_failures"] = {"failed": failed, "first": failures or [], "pass": failed == 0}
    return out


def plot(samples: list[Sample], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t_s / 60 for s in samples]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for name in samples[0].rss_mib:
        axes[0][0].plot(t, [s.rss_mib[name] for s in samples], marker=".", label=name)
        axes[0][1].plot(t, [s.fds[name] for s in samples], marker=".", label=name)
        axes[0][2].plot(t, [s.threads[name] for s in samples], marker=".", label=name)
    axes[1][0].plot(t, [s.kv_usage for s in samples], marker=".", label="KV in use (fraction)")
    ax2 = axes[1][0].twinx()
    ax2.plot(t, [s.prefix_cache_blocks for s in samples], color="C2", label="prefix blocks")
    for key, label in (("p50_e2e_s", "p50 e2e"), ("p99_e2e_s", "p99 e2e"),
                       ("p99_ttft_s", "p99 TTFT")):  # fmt: skip
        axes[1][1].plot(t, [getattr(s, key) or float("nan") for s in samples], marker=".",
                        label=label)  # fmt: skip
    axes[1][2].plot(t, [s.finished for s in samples], marker=".", label="finished")
    axes[1][2].plot(t, [s.failed for s in samples], marker=".", label="failed")
    titles = ("RSS (MiB)", "open fds", "threads", "KV in use / prefix-cache blocks",
              "latency (s)", "requests per interval")  # fmt: skip
    for ax, title in zip([a for row in axes for a in row], titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("minutes")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str, Path]:
    log = Path(f"{args.out}.server.log")
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--model", args.model,
           "--port", str(args.port), "--served-model-name", args.served_model_name,
           "--kv-cache-memory-gib", str(args.kv_cache_memory_gib), *args.serve_arg]  # fmt: skip
    if args.lora_modules:
        cmd += ["--enable-lora", "--lora-modules", args.lora_modules]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{args.port}"
    deadline = time.monotonic() + args.startup_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early; see {log}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"server not ready in {args.startup_timeout_s}s; see {log}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--served-model-name", default="soak")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--interval-s", type=float, default=60.0, help="seconds between samples")
    p.add_argument("--rate", type=float, default=None, help="requests/s (default: measured)")
    p.add_argument("--load-fraction", type=float, default=0.7)
    p.add_argument("--capacity-concurrency", type=int, default=16)
    p.add_argument("--capacity-s", type=float, default=30.0)
    p.add_argument("--max-tokens", type=int, default=64, help="each request draws 8..this")
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--lora-modules", default=None, help="NAME=PATH: a share of the mix uses it")
    p.add_argument("--kv-cache-memory-gib", type=float, default=0.5)
    p.add_argument("--rss-trend-mib", type=float, default=64.0)
    p.add_argument("--p99-ratio", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--serve-arg", action="append", default=[], help="passed to surge serve")
    p.add_argument("--out", default="soak", help="writes OUT.json, OUT.png, OUT.server.log")
    args = p.parse_args(argv)

    proc, url, _log = start_server(args)
    try:
        api = psutil.Process(proc.pid)
        engine = next(c for c in api.children() if "spawn_main" in " ".join(c.cmdline()))
        procs = {"api": api, "engine": engine}
        rng = random.Random(args.seed)
        mix = Mix(args, rng)
        t0 = time.monotonic()
        capacity = None
        if args.rate is None:
            capacity = asyncio.run(
                closed_loop(url, mix, args.capacity_concurrency, args.capacity_s)
            )
            rate = args.load_fraction * capacity
        else:
            rate = args.rate
        print(f"capacity {capacity} req/s; load {rate:.2f} req/s", flush=True)
        wait_idle(url)
        before = sample(url, procs, "idle-before", t0, [])
        samples, failed, failures = asyncio.run(
            open_loop(url, mix, rate, args.minutes * 60, args.interval_s, procs, t0)
        )
        wait_idle(url)
        after = sample(url, procs, "idle-after", t0, [])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    criteria = judge(samples, before, after, failed, args, failures)
    passed = all(c["pass"] for c in criteria.values())
    result = {
        "passed": passed, "criteria": criteria, "capacity_rps": capacity, "rate_rps": rate,
        "args": {k: v for k, v in vars(args).items()}, "cpu": _cpu(),
        "samples": [asdict(s) for s in [before, *samples, after]],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "loadavg_end": os.getloadavg(),
    }  # fmt: skip
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))
    plot([before, *samples, after], Path(f"{args.out}.png"))
    print(json.dumps({"passed": passed, "criteria": criteria}, indent=1))
    return 0 if passed else 1


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{os.cpu_count()} cpus"


if __name__ == "__main__":
    raise SystemExit(main())
