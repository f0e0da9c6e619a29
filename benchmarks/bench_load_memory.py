"""What a model costs to start: `surge serve`'s process start to a healthy /health, the engine
process's peak RSS while it loaded (VmHWM) and its RSS once ready, against the file's tensor
bytes, and the weights the load log reports by form.

    python benchmarks/bench_load_memory.py MODEL [--rounds 1] [-- extra serve flags]

e.g. a real-shape file (benchmarks/make_shape_gguf.py; real shapes, random weights: speed and
memory only, never accuracy):

    python benchmarks/make_shape_gguf.py llama-3.1-8b --types Q4_0 --direct --drop-f16
    python benchmarks/bench_load_memory.py ~/.cache/surge/shapes/llama-3.1-8b.Q4_0.gguf \\
        -- --kv-cache-memory-gib 0.25

The KV cache's pages are built in the background after the load (huge_pages.py), so RSS once
ready counts part of it: a small --kv-cache-memory-gib keeps the figures to the weights.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from surge.models.formats.model_files import open_model
from tests.servers import free_port

MIB = 1 << 20


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def one_start(model: str, extra: list[str], timeout_s: float) -> dict[str, float | str]:
    port = free_port()
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "surge.cli", "serve", "--model", model, "--port", str(port)]
        proc = subprocess.Popen([*cmd, *extra], stdout=log, stderr=subprocess.STDOUT)
        try:
            ready = wait_healthy(proc, port, t0, timeout_s)
            children = psutil.Process(proc.pid).children(recursive=True)
            engine = max(children, key=lambda c: c.memory_info().rss) if children else None
            out: dict[str, float | str] = {"ready_s": ready}
            for name, p in (("api", proc.pid), ("engine", engine.pid if engine else None)):
                if p is not None:
                    out[f"{name}_peak_mib"] = status_kib(p, "VmHWM") / 1024
                    out[f"{name}_rss_mib"] = status_kib(p, "VmRSS") / 1024
                    out[f"{name}_anon_mib"] = status_kib(p, "RssAnon") / 1024
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        log.seek(0)
        text = log.read()
    weights = re.search(r"weights ([\d.]+ MiB \([^)]*\))", text)
    out["weights"] = weights.group(1) if weights else "(no weights line in the log)"
    return out


def wait_healthy(proc: subprocess.Popen[bytes], port: int, t0: float, timeout_s: float) -> float:
    while time.perf_counter() - t0 < timeout_s:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return time.perf_counter() - t0
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"surge serve exited with {proc.returncode}")
        time.sleep(0.05)
    raise SystemExit(f"not healthy within {timeout_s} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.extra = argv[cut + 1 :]  # surge serve flags, after --
    files = open_model(args.model)
    print(f"{args.model}: {files.tensor_bytes / MIB:.1f} MiB of tensors (layers "
          f"{files.layer_format})")  # fmt: skip
    for _ in range(args.rounds):
        r = one_start(args.model, args.extra, args.timeout)
        print(
            f"ready in {r['ready_s']:.1f} s; engine peak RSS {r.get('engine_peak_mib', 0):.0f} "
            f"MiB, RSS at ready {r.get('engine_rss_mib', 0):.0f} MiB (anonymous "
            f"{r.get('engine_anon_mib', 0):.0f}); API process RSS {r.get('api_rss_mib', 0):.0f} "
            f"MiB; weights {r['weights']}"
        )


if __name__ == "__main__":
    main()
