"""Predictive scaling for real, scaled down: `surge autoscale` with local replicas of the tiny
test model (a random 2-layer Llama with SmolLM2's tokenizer; the default model's replicas do not
fit 2 cores several times over), driven by `surge bench --traffic sinusoid` with a period of
minutes for several periods, once per policy: no forecast, the seasonal forecast with the period
given and no history, and the same seeded at start from a real Prometheus holding
--history-periods of the same traffic (`--forecast-history-url`, as a fleet whose Prometheus has
watched its traffic would start).

It samples the autoscaler's metrics every 0.5 s and reports, per run and per period, when the
ready replicas reached that period's maximum against when the load crossed half-way up its rise
(t = k x period for bench's sinusoid): the lead of capacity (positive: ready before the rise
needed it). Plus bench's SLO attainment. Plots: DIR/predictive.png. Everything it started is
stopped by PID.

    python benchmarks/bench_predictive.py --period 180 --periods 4 --out /tmp/predictive
    python benchmarks/bench_predictive.py --period 40 --periods 2 --out /tmp/smoke   # smoke
    (--cpus-per-replica auto pins each replica to its own cores, so that one adds capacity)
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_autoscale import metric
from tests.conftest import write_tiny_llama
from tests.observability.prom_process import PrometheusProcess, prometheus_holding_counter
from tests.servers import free_port


def sample(metrics_url: str, stop: threading.Event, out: list[tuple[float, float, float]],
           t0: float) -> None:  # fmt: skip
    with httpx.Client(timeout=2) as http:
        while not stop.is_set():
            try:
                text = http.get(metrics_url).text
                ready = metric(text, "surge_autoscaler_replicas", '{state="ready"}')
                starting = metric(text, "surge_autoscaler_replicas", '{state="starting"}')
                out.append((time.monotonic() - t0, ready, starting))
            except httpx.HTTPError:
                pass
            stop.wait(0.5)


HISTORY_WINDOW_S = 6  # the history query's rate window: short against a period of minutes


def history_prometheus(args: argparse.Namespace, folder: Path, t0_unix: float) -> PrometheusProcess:
    """A Prometheus holding --history-periods of the run's own sinusoid before t0_unix (when the
    bench will start), as the fleet's counter sampled every second: what a Prometheus that had
    watched this traffic for that long would hold."""
    swing, w = args.peak - args.base, 2 * math.pi / args.period

    def received(t: float) -> float:  # the integral of bench's sinusoid rate from t = 0
        return (args.base + swing / 2) * t - swing / 2 / w * math.cos(w * t)

    start = -args.history_periods * args.period
    seconds = range(int(args.history_periods * args.period))
    return prometheus_holding_counter(
        folder,
        'surge:requests_received_total{model_name="test-model"}',
        ((t0_unix + start + k, received(start + k) - received(start)) for k in seconds),
    )


def one_run(args: argparse.Namespace, model: str, policy: str, out_dir: Path) -> dict:
    port, mport = free_port(), free_port()
    horizon = args.cold_start + 2
    forecaster, _, seeded = policy.partition("+")  # "seasonal+history": history at start
    prom = None
    t0_unix = time.time() + args.start_margin
    if seeded:
        prom = history_prometheus(args, out_dir / f"prom-{forecaster}", t0_unix)
    cmd = [
        sys.executable, "-m", "surge.cli", "autoscale", "--port", str(port),
        "--base-port", str(free_port()), "--metrics-port", str(mport), "--log-dir", str(out_dir),
        "--min-replicas", "1", "--max-replicas", str(args.max_replicas),
        "--target-ongoing", str(args.target_ongoing), "--interval", "1",
        "--scale-down-window", str(args.period / 6), "--cpus-per-replica", args.cpus_per_replica,
        "--forecaster", forecaster,
        "--forecast-horizon", str(horizon if forecaster != "none" else 0),
        "--forecast-step", str(args.period / 36), "--forecast-period", str(args.period),
        "--", "--model", model, "--served-model-name", "test-model",
        *(["--dtype", "float32"] if args.model == "tiny" else []),
        "--max-num-seqs", str(args.max_num_seqs), "--kv-cache-memory-gib", "0.1",
    ]  # fmt: skip
    if prom is not None:
        at = cmd.index("--")
        cmd[at:at] = ["--forecast-history-url", prom.url, "--forecast-history-query",
                      f"sum(rate(surge:requests_received_total[{HISTORY_WINDOW_S}s]))"]  # fmt: skip
    log = (out_dir / f"autoscale-{policy}.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    samples: list[tuple[float, float, float]] = []
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the gateway did not come up; see {log.name}")
        if prom is not None:  # the history's phase: the bench starts when the history said
            late = time.time() - t0_unix
            if late > 0:
                print(f"{policy}: the gateway came up {late:.1f} s after the history's t = 0 "
                      "(raise --start-margin): the history is that much out of phase")  # fmt: skip
            time.sleep(max(0.0, -late))
        t0 = time.monotonic()
        sampler = threading.Thread(target=sample, args=(f"http://127.0.0.1:{mport}/metrics",
                                                         stop, samples, t0))  # fmt: skip
        sampler.start()
        result = out_dir / f"bench-{policy}.json"
        bench = [
            sys.executable, "-m", "surge.cli", "bench", "--url", url, "--model", "test-model",
            "--traffic", f"sinusoid:base={args.base},peak={args.peak},period={args.period}",
            "--duration", str(args.period * args.periods), "--drain", "30",
            "--input-len", "32", "--output-len", str(args.output_len), "--slo", args.slo,
            "--output", str(result), "--no-progress",
        ]  # fmt: skip
        subprocess.run(
            bench, check=True, stdout=subprocess.DEVNULL, timeout=args.period * args.periods + 300
        )
        stop.set()
        sampler.join()
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if prom is not None:
            prom.stop()
    summary = json.loads(result.read_text())["summary"]
    goodput = summary.get("goodput") or {}
    return {"forecaster": policy, "samples": samples, "leads": leads(samples, args),
            "slo_attainment": goodput.get("fraction_met"),
            "requests": summary["num_requests"], "errors": summary["num_errors"]}  # fmt: skip


def leads(samples: list[tuple[float, float, float]], args: argparse.Namespace) -> list[dict]:
    """Per period k: the load crosses half-way up at t = k x period; capacity's lead is that
    time minus when the ready count first reached its maximum of the period's rise
    [k P - P/4, k P + P/4] (the sinusoid's top is at k P + P/4)."""
    out = []
    for k in range(args.periods):
        mid = k * args.period
        window = [s for s in samples if mid - args.period / 4 <= s[0] <= mid + args.period / 4]
        if not window:
            continue
        top = max(r for _, r, _ in window)
        first = next(t for t, r, _ in window if r >= top)
        out.append({"period": k, "load_rises_s": mid, "ready_max": top, "ready_at_s": first,
                    "lead_s": mid - first})  # fmt: skip
    return out


def plot(runs: list[dict], args: argparse.Namespace, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3 + 2 * len(runs)))
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    for ax, run in zip(axes, runs, strict=True):
        t = [s[0] for s in run["samples"]]
        ax.step(t, [s[1] for s in run["samples"]], where="post", label="ready")
        ax.step(t, [s[1] + s[2] for s in run["samples"]], where="post", alpha=0.6,
                label="ready + starting")  # fmt: skip
        twin = ax.twinx()
        swing = args.peak - args.base
        rate = [args.base + swing * (1 + math.sin(2 * math.pi * x / args.period)) / 2 for x in t]
        twin.plot(t, rate, color="grey", lw=0.8, label="offered req/s")
        twin.set_ylabel("req/s")
        ax.set_ylabel("replicas")
        ax.set_title(f"forecaster {run['forecaster']}: SLO met {run['slo_attainment']}")
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds")
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--period", type=float, default=180.0)
    ap.add_argument("--periods", type=int, default=4)
    ap.add_argument("--base", type=float, default=1.0)
    ap.add_argument("--peak", type=float, default=12.0)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--target-ongoing", type=float, default=4.0)
    ap.add_argument("--max-replicas", type=int, default=3)
    ap.add_argument(
        "--cpus-per-replica", default="0",
        help="autoscale's: 0 = unpinned; auto = the cores split between --max-replicas, so that "
        "a replica adds capacity instead of contention",
    )  # fmt: skip
    ap.add_argument("--cold-start", type=float, default=6.0, help="the horizon: start + tick")
    ap.add_argument("--slo", default="ttft=1s,tpot=50ms")
    ap.add_argument(
        "--forecasters", default="none,seasonal,seasonal+history",
        help="runs, one after another: a forecaster, or FORECASTER+history to seed it at start "
        "from a Prometheus holding --history-periods of the same traffic",
    )  # fmt: skip
    ap.add_argument("--history-periods", type=float, default=2.0)
    ap.add_argument(
        "--model", default="tiny",
        help="tiny (a random 2-layer Llama: fast, so its replicas add little capacity) or what "
        "surge serve --model takes (with --cpus-per-replica auto, a replica a core)",
    )  # fmt: skip
    ap.add_argument(
        "--start-margin", type=float, default=45.0,
        help="+history: seconds from writing the history to the bench's start",
    )  # fmt: skip
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    from surge.models.formats.resolve import resolve_model

    model = args.model
    if model == "tiny":
        model = str(write_tiny_llama(Path(tempfile.mkdtemp(prefix="tiny-", dir=out_dir)),
                                     resolve_model("smollm2-135m")))  # fmt: skip
    runs = [one_run(args, model, f, out_dir) for f in args.forecasters.split(",")]
    for run in runs:
        leads_s = [x["lead_s"] for x in run["leads"]]
        print(f"{run['forecaster']:>9}: SLO met {run['slo_attainment']}, {run['requests']} "
              f"requests, {run['errors']} errors, lead of the ready replicas at each rise (s): "
              f"{leads_s}")  # fmt: skip
    (out_dir / "predictive.json").write_text(json.dumps(runs, indent=1))
    plot(runs, args, out_dir / "predictive.png")
    print(f"plots: {out_dir / 'predictive.png'}")


if __name__ == "__main__":
    main()
