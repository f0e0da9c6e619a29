"""`surge autoscale [flags] -- [surge serve flags]`: a gateway on one port in front of replicas
the autoscaler starts and drains as local processes.

    surge autoscale --port 8080 --min-replicas 1 --max-replicas 3 -- --model smollm2-135m

Ctrl-C / SIGTERM: the gateway stops, then every replica drains (finishes what it holds).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from surge.autoscale.config import AutoscalerConfig
from surge.autoscale.controller import Autoscaler
from surge.autoscale.history import add_history_flags, history_config, load_history
from surge.autoscale.observe import add_observe_flags, observed_provider
from surge.autoscale.providers.base import Provider, ReplicaStartError, wait_healthy
from surge.autoscale.providers.local import LocalProcessProvider, LocalProviderConfig
from surge.config.settings import settings
from surge.observability.autoscaler_metrics import AutoscalerMetrics

log = logging.getLogger("surge.autoscale")

# flag -> (AutoscalerConfig field, type, help)
_FLAGS: dict[str, tuple[str, type, str]] = {
    "--min-replicas": (
        "min_replicas",
        int,
        "never fewer ready or starting; 0: scale to zero when idle",
    ),
    "--max-replicas": ("max_replicas", int, "never more"),
    "--initial-replicas": ("initial_replicas", int, "started before serving (default: min)"),
    "--target-ongoing": ("target_ongoing_per_replica", float, "running+waiting per replica"),
    "--target-waiting": ("target_waiting_per_replica", float, "waiting requests per replica"),
    "--target-kv-usage": ("target_kv_usage", float, "mean KV cache usage, 0..1"),
    "--tolerance": ("tolerance", float, "no change within this fraction of a target"),
    "--interval": ("interval_s", float, "seconds between decisions"),
    "--scale-up-window": ("scale_up_window_s", float, "seconds a higher need must last"),
    "--scale-down-window": ("scale_down_window_s", float, "seconds a lower need must last"),
    "--max-scale-up-step": ("max_scale_up_step", int, "replicas added per decision (period)"),
    "--max-scale-down-step": (
        "max_scale_down_step",
        int,
        "replicas drained per decision (period)",
    ),
    "--scale-period": (
        "scale_period_s",
        float,
        "the steps and percents bound each period this long (HPA's periodSeconds); 0: each "
        "decision",
    ),
    "--max-scale-up-percent": (
        "max_scale_up_percent",
        float,
        "or this percent of the period's start, if more (0: the step alone)",
    ),
    "--max-scale-down-percent": (
        "max_scale_down_percent",
        float,
        "or this percent of the period's start, if more (0: the step alone)",
    ),
    "--batch-margin": (
        "batch_margin_s",
        float,
        "replicas for batch work only if it would not finish this many seconds before its "
        "window closes",
    ),
    "--batch-window": ("batch_window_s", float, "seconds a batch's call for more must last"),
    "--forecast-horizon": ("forecast_horizon_s", float, "seconds ahead; 0 = no forecast"),
    "--forecaster": ("forecaster", str, "holt | seasonal | learned | none"),
    "--forecast-step": ("forecast_step_s", float, "seasonal, learned: seconds per history bin"),
    "--forecast-period": ("forecast_period_s", float, "seasonal, learned: the season (s)"),
    "--drain-timeout": ("drain_timeout_s", float, "seconds a draining replica gets"),
    "--reload-grace": ("reload_grace_s", float, "seconds between leaving rotation and SIGTERM"),
    "--activation-timeout": (
        "activation_timeout_s",
        float,
        "scaled to zero: seconds the gateway holds a request for a replica",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="surge autoscale",
        description="A gateway in front of replicas started and drained by load. "
        "Arguments after -- go to every replica's `surge serve`.",
    )
    p.add_argument("--host", default="127.0.0.1", help="the gateway's and replicas' address")
    p.add_argument("--port", type=int, default=8080, help="the gateway's port; 0: no gateway")
    p.add_argument("--base-port", type=int, default=8100, help="replicas take ports from here")
    p.add_argument(
        "--provider",
        choices=("local", "ray"),
        default="local",
        help="where replicas run: local processes, or actors on a Ray cluster (surge[ray])",
    )
    p.add_argument(
        "--cpus-per-replica",
        default="auto",
        help="pin each local replica to this many cores of its own; 'auto': the cores / "
        "--max-replicas on a machine without an NVIDIA GPU, else no pinning; 0: no pinning",
    )
    p.add_argument(
        "--ray-address",
        default="auto",
        help="the Ray cluster: 'auto' (the running one), an address, or 'local' (start one here)",
    )
    p.add_argument("--ray-num-cpus", type=float, default=1.0, help="CPUs one replica reserves")
    p.add_argument("--ray-num-gpus", type=float, default=0.0, help="GPUs one replica reserves")
    p.add_argument("--upstreams-file", default=None, help="where the ready replicas are listed")
    p.add_argument("--metrics-port", type=int, default=None, help="the autoscaler's /metrics")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds per replica")
    p.add_argument("--log-dir", default=None, help="replica logs (default: the temp folder)")
    p.add_argument("--gateway-arg", action="append", default=[], help="passed to `surge gateway`")
    p.add_argument("--log-level", default=settings().log_level)
    add_observe_flags(p)
    add_history_flags(p)
    defaults = AutoscalerConfig()
    for flag, (name, kind, text) in _FLAGS.items():
        p.add_argument(flag, type=kind, default=getattr(defaults, name), help=text)
    return p


def autoscaler_config(args: argparse.Namespace) -> AutoscalerConfig:
    return AutoscalerConfig(
        **{name: getattr(args, flag[2:].replace("-", "_")) for flag, (name, _, _) in _FLAGS.items()}
    )


async def _stop_when_exited(proc: subprocess.Popen[bytes], stop: asyncio.Event) -> None:
    """Without its gateway the fleet serves no one: stop (and drain) when it exits."""
    while proc.poll() is None:
        await asyncio.sleep(1.0)
    stop.set()


def cpus_per_replica(value: str, max_replicas: int) -> int | None:
    if value == "auto":
        if Path("/proc/driver/nvidia/gpus").is_dir():
            return None  # GPU replicas: their cores are not the bottleneck
        return max(1, len(os.sched_getaffinity(0)) // max_replicas)
    try:
        n = int(value)
    except ValueError:
        raise SystemExit(f"--cpus-per-replica: expected auto or a number, got {value!r}") from None
    return n or None


def _start_gateway(
    args: argparse.Namespace, config: AutoscalerConfig, upstreams: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "surge.cli",
        "gateway",
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--upstreams-file",
        str(upstreams),
        "--reload-interval",
        "0.5",
        *args.gateway_arg,
    ]
    if args.metrics_port is not None:  # its desired/ready/forecast on the gateway's /dashboard
        cmd += ["--autoscaler-url", f"http://{args.host}:{args.metrics_port}"]
    if config.min_replicas == 0:  # with no replica, requests wait for one (and wake us)
        cmd += ["--activation-timeout", str(config.activation_timeout_s)]
    out = log_path.open("wb")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


async def run(args: argparse.Namespace, serve_args: Sequence[str]) -> int:
    config = autoscaler_config(args)
    log_dir = Path(args.log_dir or tempfile.gettempdir())
    upstreams = Path(args.upstreams_file or log_dir / f"surge-autoscale-{os.getpid()}.json")
    provider: Provider
    observed = observed_provider(args, serve_args)
    if observed is not None:
        provider = observed
    elif args.provider == "ray":
        from surge.autoscale.providers.ray import RayProvider, RayProviderConfig

        provider = RayProvider(
            RayProviderConfig(
                tuple(serve_args),
                None if args.ray_address == "local" else args.ray_address,
                args.ray_num_cpus,
                args.ray_num_gpus,
                args.base_port,
                args.startup_timeout,
                log_dir=str(log_dir) if args.log_dir else None,  # else each node's temp dir
            )
        )
    else:
        provider = LocalProcessProvider(
            LocalProviderConfig(
                tuple(serve_args),
                args.host,
                args.base_port,
                args.startup_timeout,
                log_dir,
                cpus_per_replica(args.cpus_per_replica, config.max_replicas),
            )
        )
    metrics = AutoscalerMetrics()
    metrics.set_limits(config.min_replicas, config.max_replicas)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
    scaler = Autoscaler(config, provider, None if observed else upstreams, metrics)
    if observed is not None:
        scaler.act, scaler.gateway_url = False, args.gateway_url
    history = history_config(args, config)
    if history is not None:  # before the first tick: the forecasters start knowing the past
        metrics.set_history_points(await load_history(scaler.forecasts, history, scaler.clock))
        metrics.observe_forecasts(scaler.forecasts.views())
    keda = None
    if args.keda_external_scaler_port is not None:
        try:
            from surge.autoscale.keda.board import Board
            from surge.autoscale.keda.server import start_server
        except ImportError as e:
            log.error("--keda-external-scaler-port needs grpcio: pip install 'surge[keda]' (%s)", e)
            return 1
        board = Board()
        scaler.on_decision = board.update
        keda = await start_server(board, args.host, args.keda_external_scaler_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gateway: subprocess.Popen[bytes] | None = None
    watcher: asyncio.Task[None] | None = None
    try:
        if observed is None:
            log.info(
                "starting %d replica(s): surge serve %s",
                config.start_replicas,
                " ".join(serve_args),
            )
            await scaler.start_initial()
        if args.port and observed is None:
            gateway_log = log_dir / f"surge-autoscale-gateway-{args.port}.log"
            gateway = proc = _start_gateway(args, config, upstreams, gateway_log)
            url = f"http://{args.host}:{args.port}"
            scaler.gateway_url = url

            async def running() -> bool:
                return proc.poll() is None

            await wait_healthy(url, "the gateway", running, 60.0, str(gateway_log), poll_s=0.2)
            log.info("gateway on %s (pid %d), upstreams in %s", url, gateway.pid, upstreams)
            watcher = asyncio.create_task(_stop_when_exited(gateway, stop))
        await scaler.run(stop)
        if gateway is not None and gateway.poll() is not None:
            log.error("the gateway exited with %s: stopping", gateway.returncode)
            return 1
        return 0
    except (ReplicaStartError, RuntimeError) as e:
        log.error("%s", e)
        return 1
    finally:
        if keda is not None:
            await keda.stop(1.0)
        if watcher is not None:
            watcher.cancel()
        if gateway is not None and gateway.poll() is None:
            gateway.send_signal(signal.SIGTERM)  # uvicorn lets in-flight requests finish
            try:
                await asyncio.to_thread(gateway.wait, 30)
            except subprocess.TimeoutExpired:
                gateway.kill()
        if observed is None:
            log.info("draining %d replica(s)", len(provider.replicas()))
        await scaler.close()


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    serve_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, serve_args = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per scrape otherwise
    try:
        autoscaler_config(args)
    except ValueError as e:
        raise SystemExit(f"surge autoscale: {e}") from None
    from surge.http.event_loop import run as run_loop

    return run_loop(run(args, serve_args))
