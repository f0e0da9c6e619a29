"""`surge autoscale simulate` and `surge autoscale recommend`.

    surge autoscale simulate --traffic sinusoid:base=2,peak=20,period=86400 --duration 1d \\
        --history 2d --profile deploy/profiles/smollm2-135m-cpu.json --slo ttft=2s,tpot=100ms \\
        [--policies reactive,keda,holt,seasonal,learned,oracle] [--json] [--plots DIR] \\
        [--batch lines=5000,tokens=200,window=6h,at=14:00] [--stabilization surge,hpa,hpa-pods]
    surge autoscale recommend --profile F --peak-rps 20 --slo ttft=2s,tpot=100ms
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from surge.autoscale.config import AutoscalerConfig
from surge.bench.config import Slo
from surge.fleetsim.args import batch_spec, duration, slo
from surge.fleetsim.control import POLICIES, STABILIZATIONS
from surge.fleetsim.profile import load_profile


def simulate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="surge autoscale simulate",
        description="A fleet behind the gateway, simulated: surge bench's traffic, a measured "
        "capacity profile, and the autoscaler's own decision code under each policy.",
    )
    p.add_argument(
        "--traffic",
        required=True,
        help="a surge bench traffic spec, several joined by + (merged), or trace:FILE",
    )
    p.add_argument("--duration", type=duration, default=86400.0, help="simulated span: 1d, 6h")
    p.add_argument(
        "--history",
        type=duration,
        default=0.0,
        help="traffic fed to the forecasters before the span (e.g. 2d)",
    )
    p.add_argument("--profile", required=True, help="surge bench sweep --concurrency --output")
    p.add_argument("--cold-start", type=duration, help="replica start time (default: profile)")
    p.add_argument("--slo", type=slo, default=Slo(2.0, 0.1))
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument(
        "--mode",
        choices=("auto", "requests", "fluid"),
        default="auto",
        help="requests: per request; fluid: rates (auto: fluid past 300k arrivals)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=100)
    p.add_argument(
        "--target-ongoing",
        type=float,
        help="default: the highest profiled concurrency that meets the SLO",
    )
    p.add_argument("--target-waiting", type=float, default=2.0)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--scale-up-window", type=float, default=0.0)
    p.add_argument("--scale-down-window", type=float, default=60.0)
    p.add_argument("--max-scale-up-step", type=int, default=4)
    p.add_argument("--max-scale-down-step", type=int, default=1)
    p.add_argument(
        "--scale-period",
        type=float,
        default=0.0,
        help="the steps and percents bound each period this long (0: each decision)",
    )
    p.add_argument("--max-scale-up-percent", type=float, default=0.0)
    p.add_argument("--max-scale-down-percent", type=float, default=0.0)
    p.add_argument(
        "--stabilization",
        default="surge",
        help=f"one or more of {','.join(STABILIZATIONS)}: surge = the flags above; hpa = "
        "Kubernetes HPA's defaults (down after 300 s; up by max(4, 100%%), down by 100%% per "
        "15 s); hpa-pods = its window, +4/-1 replicas per 15 s; none = no window or step. "
        "Each policy runs under each",
    )
    p.add_argument(
        "--batch",
        type=batch_spec,
        action="append",
        default=[],
        metavar="lines=N,tokens=T,window=6h,at=14:00[,every=1d]",
        help="batch work at the lowest priority, in what interactive traffic leaves "
        "(repeatable); reports each policy's window attainment",
    )
    p.add_argument(
        "--batch-margin",
        type=duration,
        default=600.0,
        help="replicas for a batch only if it would not finish this long before "
        "its window closes (10m)",
    )
    p.add_argument(
        "--batch-window",
        type=duration,
        default=60.0,
        help="seconds a batch's call for more replicas must last",
    )
    p.add_argument("--forecast-horizon", type=float, help="default: cold start + interval")
    p.add_argument("--season-step", type=duration, default=60.0, help="forecast bin width")
    p.add_argument("--period", type=duration, help="season length (default: detected)")
    p.add_argument("--max-num-seqs", type=int, help="default: the profile's highest level")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plots", metavar="DIR", help="demand, capacity and replicas per policy")
    return p


def cmd_simulate(argv: Sequence[str]) -> int:
    from surge.fleetsim.simulate import SimConfig, simulate, with_defaults
    from surge.fleetsim.traffic import Traffic

    parser = simulate_parser()
    args = parser.parse_args(argv)
    try:
        profile = load_profile(args.profile, args.cold_start)
        auto = AutoscalerConfig(
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            target_waiting_per_replica=args.target_waiting,
            interval_s=args.interval,
            scale_up_window_s=args.scale_up_window,
            scale_down_window_s=args.scale_down_window,
            max_scale_up_step=args.max_scale_up_step,
            max_scale_down_step=args.max_scale_down_step,
            scale_period_s=args.scale_period,
            max_scale_up_percent=args.max_scale_up_percent,
            max_scale_down_percent=args.max_scale_down_percent,
            batch_margin_s=args.batch_margin,
            batch_window_s=args.batch_window,
        )
        auto = with_defaults(auto, profile, args.slo.ttft_s, args.slo.tpot_s, args.target_ongoing)
        policies = tuple(p for p in args.policies.split(",") if p)
        unknown = set(policies) - set(POLICIES)
        if unknown:
            raise ValueError(f"unknown policies {sorted(unknown)}; choose from {POLICIES}")
        config = SimConfig(
            Traffic.parse(args.traffic),
            profile,
            auto,
            args.duration,
            args.history,
            args.slo.ttft_s,
            args.slo.tpot_s,
            policies,
            args.mode,
            args.seed,
            args.forecast_horizon,
            args.season_step,
            args.period,
            args.max_num_seqs,
            batches=tuple(args.batch),
            stabilizations=tuple(x for x in args.stabilization.split(",") if x),
        )
    except (ValueError, OSError) as e:
        parser.error(str(e))
    result = simulate(config)
    data = result.to_dict()
    data["traffic"] = args.traffic
    if args.plots:
        from surge.fleetsim.plots import save_plots

        data["plots"] = [str(p) for p in save_plots(result, args.plots, args.traffic)]
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(format_table(data))
    return 0


def format_table(data: dict[str, object]) -> str:
    policies = data["policies"]
    assert isinstance(policies, dict)
    width = max(10, *(len(n) + 2 for n in policies))
    batch = any(s["batch"] for s in policies.values())
    head = (
        f"{'policy':<{width}}{'SLO met':>9}{'goodput/s':>11}{'replica-h':>11}"
        f"{'events':>8}{'max':>6}"
    )
    if batch:
        head += f"{'windows met':>13}{'lines done':>12}{'ups for batch':>15}"
    lines = [
        f"{data['traffic']}  ({data['mode']} mode, {data['duration_s']:g} s, cold start "
        f"{data['cold_start_s']:g} s, target {data['target_ongoing']:g} ongoing/replica, "
        f"{data['elapsed_s']:.1f} s to simulate)",
        head + f"{'lead at peaks (s)':>20}",
    ]
    for name, s in policies.items():
        leads = [p["lead_s"] for p in s["peaks"]]
        lead = ",".join("-" if x is None else f"{x:.0f}" for x in leads[:6])
        met = s["slo_attainment"]
        b = s["batch"]
        cols = ""
        if batch and b:
            done = b["lines_done"] / b["lines"]
            ups = b["scale_ups_for_batch"]
            cols = f"{b['window_attainment']:>13.0%}{done:>12.1%}{ups:>15}"
        lines.append(
            f"{name:<{width}}{'-' if met is None else f'{met:.2%}':>9}{s['goodput_rps']:>11.2f}"
            f"{s['replica_hours']:>11.2f}{s['scale_events']:>8}{s['max_replicas']:>6}{cols}"
            f"  {lead or '-'}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "simulate":
        return cmd_simulate(argv[1:])
    if argv and argv[0] == "recommend":
        from surge.fleetsim.recommend import cmd_recommend

        return cmd_recommend(argv[1:])
    print("usage: surge autoscale simulate|recommend ...", file=sys.stderr)
    return 2
