"""`surge bench`: argparse -> BenchConfig -> run -> table, JSON, plots.

surge bench --url URL [--model M] [load] [workload] [--slo ...] [--output F] [--plots DIR]
surge bench sweep --url URL (--rates 1,2,4 | --start-rate 1 | --concurrency 1,8,32) ...
surge bench compare A.json B.json
surge bench plot RESULT.json --plots DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from surge.bench import config as cfg
from surge.bench.metrics import summarize
from surge.bench.report import config_dict, describe_load, format_table

LOAD_HELP = """\
load (one of; default --concurrency 1):
  closed loop   --concurrency N: N clients, each sends when its last answer ends
  open loop     --rate R [--arrival constant|poisson|gamma] [--cv CV]
                  constant t_k = k/R; poisson: exponential gaps; gamma: gaps with mean 1/R, CV cv
                --sinusoid base=B,peak=P,period=T
                  Poisson with rate(t) = B + (P - B) * (1 + sin(2 pi t / T)) / 2  (never < 0)
                --pulse size=N,period=T[,base=B]   N at once every T s, Poisson at B between
                --step 0:2,30:8,60:4   Poisson at rate 2 from 0 s, 8 from 30 s, 4 from 60 s
                --trace FILE [--trace-speedup X]   JSONL {"t", "prompt"|"prompt_tokens",
                  "max_tokens", "tenant"?, "priority"?}; times divided by X
                --traffic KIND:k=v,...   any of the above in one spec, e.g. gamma:rate=4,cv=2
the run ends at --num-requests or --duration, whichever comes first; requests still in flight
--drain seconds after the duration are cancelled (reported as cancelled, not as errors).
"""


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return v


def _spec(parse: Callable[[str], object]) -> Callable[[str], object]:
    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__.strip("_")
    return convert


def add_common_args(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("target")
    t.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    t.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    t.add_argument(
        "--api",
        choices=["completions", "chat", "embeddings"],
        default="completions",
        help="embeddings: one input per request; its answer counts as the first token",
    )
    t.add_argument("--api-key", help="sent as a Bearer token")
    t.add_argument("--label", default="", help="a name for this run in tables and compare")
    b = p.add_argument_group("bounds")
    b.add_argument("--num-requests", type=_positive_int)
    b.add_argument("--duration", type=_spec(cfg.parse_duration), help="e.g. 60, 60s, 5m")
    b.add_argument("--drain", type=_spec(cfg.parse_duration), help="grace after the duration")
    b.add_argument("--seed", type=int, default=0, help="same seed: same arrivals and prompts")
    b.add_argument("--warmup", type=int, default=0, help="unmeasured requests sent first")
    w = p.add_argument_group("workload")
    length, default_len = _spec(cfg.LengthDist.parse), cfg.LengthDist("fixed", 128)
    w.add_argument(
        "--input-len",
        type=length,
        default=default_len,
        help="128 | uniform:64,256 | normal:128,32 | lognormal:128,0.5",
    )
    w.add_argument(
        "--output-len",
        type=length,
        default=default_len,
        help="max_tokens, same syntax as --input-len",
    )
    w.add_argument("--dataset", help='JSONL of {"prompt": str, "max_tokens"?: int}')
    w.add_argument("--prefix-groups", type=int, default=0, help="G groups sharing a prefix")
    w.add_argument("--prefix-len", type=int, default=0, help="tokens of each group's prefix")
    w.add_argument(
        "--tenants",
        type=_spec(cfg.parse_tenants),
        default=(),
        help="name:weight[:priority],... e.g. a:10,b:1 (request shares)",
    )
    w.add_argument("--priority", type=int, help="priority of every request (or per tenant)")
    w.add_argument("--tokenizer", help="HF tokenizer.json: exact prompt token counts")
    w.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask for exactly max_tokens (default: on, not with --dataset)",
    )
    w.add_argument("--temperature", type=float, default=0.0)
    w.add_argument("--extra-body", type=json.loads, default={}, help="JSON merged into bodies")
    w.add_argument(
        "--continuous-usage",
        action="store_true",
        help="ask for usage in every chunk (vLLM): exact tokens per chunk",
    )
    h = p.add_argument_group("http")
    h.add_argument("--connect-timeout", type=float, default=10.0)
    h.add_argument("--timeout", type=float, default=600.0, help="read timeout between bytes (s)")
    h.add_argument("--request-timeout", type=float, help="bound on one whole request (s)")
    o = p.add_argument_group("results")
    o.add_argument(
        "--slo",
        type=_spec(cfg.Slo.parse),
        default=cfg.Slo(),
        help="targets for goodput, any of ttft=2s,tpot=100ms,e2e=30s",
    )
    o.add_argument("--output", help="write config, summary and raw records as JSON here")
    o.add_argument("--no-progress", action="store_true")


def add_load_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load (formulas at the end)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--concurrency", type=_positive_int)
    x.add_argument("--rate", type=float, help="requests/s")
    x.add_argument("--sinusoid", metavar="base=B,peak=P,period=T")
    x.add_argument("--pulse", metavar="size=N,period=T[,base=B]")
    x.add_argument("--step", metavar="START:RATE,...")
    x.add_argument("--trace", metavar="FILE")
    x.add_argument("--traffic", metavar="KIND:k=v,...")
    g.add_argument("--arrival", choices=["poisson", "constant", "gamma"], default="poisson")
    g.add_argument("--cv", type=float, default=1.0, help="gamma gaps' coefficient of variation")
    g.add_argument("--trace-speedup", type=float, default=1.0)
    g.add_argument("--max-concurrency", type=_positive_int, help="open loop: cap in flight")


def arrival_of(args: argparse.Namespace) -> cfg.ArrivalConfig | None:
    if args.rate is not None:
        return cfg.ArrivalConfig(args.arrival, rate_rps=args.rate, cv=args.cv)
    if args.sinusoid:
        return cfg.ArrivalConfig.parse("sinusoid:" + args.sinusoid)
    if args.pulse:
        return cfg.ArrivalConfig.parse("pulse:" + args.pulse)
    if args.step:
        return cfg.ArrivalConfig.parse("step:" + args.step)
    if args.trace:
        return cfg.ArrivalConfig("trace", trace_speedup=args.trace_speedup)
    if args.traffic:
        return cfg.ArrivalConfig.parse(args.traffic)
    return None


def discover_model(url: str, api_key: str | None, timeout_s: float) -> str:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=timeout_s)
        resp.raise_for_status()
        data = resp.json().get("data") or []
    except (httpx.HTTPError, ValueError) as e:
        raise ValueError(f"cannot list the models at {url} ({e}): pass --model") from None
    if not data:
        raise ValueError(f"{url}/v1/models lists no model: pass --model")
    return str(data[0]["id"])


def bench_config(args: argparse.Namespace, arrival: cfg.ArrivalConfig | None) -> cfg.BenchConfig:
    trace = getattr(args, "trace", None)
    workload = cfg.WorkloadConfig(
        input_len=args.input_len,
        output_len=args.output_len,
        dataset_path=args.dataset,
        trace_path=trace,
        num_prefix_groups=args.prefix_groups,
        prefix_len=args.prefix_len,
        tenants=args.tenants,
        priority=args.priority,
        tokenizer_path=args.tokenizer,
    )
    concurrency = getattr(args, "concurrency", None)
    if arrival is None and not isinstance(concurrency, int):
        concurrency = 1
    num_requests = args.num_requests
    is_trace = arrival is not None and arrival.kind == "trace"
    if num_requests is None and args.duration is None and not is_trace:
        num_requests = 100  # a run must end; a trace ends with its file
    return cfg.BenchConfig(
        url=args.url.rstrip("/"),
        model=args.model or discover_model(args.url, args.api_key, args.connect_timeout),
        api=args.api,
        concurrency=concurrency if arrival is None else None,
        arrival=arrival,
        max_concurrency=getattr(args, "max_concurrency", None),
        num_requests=num_requests,
        duration_s=args.duration,
        drain_s=args.drain or 0.0,
        num_warmup=args.warmup,
        seed=args.seed,
        workload=workload,
        slo=args.slo,
        ignore_eos=args.ignore_eos if args.ignore_eos is not None else args.dataset is None,
        temperature=args.temperature,
        continuous_usage=args.continuous_usage,
        extra_body=tuple(args.extra_body.items()),
        api_key=args.api_key,
        connect_timeout_s=args.connect_timeout,
        read_timeout_s=args.timeout,
        request_timeout_s=args.request_timeout,
        label=args.label,
    )


def check_inputs(config: cfg.BenchConfig) -> None:
    """Read the dataset, trace and tokenizer now, so a bad file fails before the run starts."""
    from surge.bench.workload import prompts

    next(prompts(config.workload, config.seed), None)


def run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="surge bench",
        description="Load generator for any OpenAI-compatible server.",
        epilog=LOAD_HELP + "\nsubcommands: surge bench sweep -h | compare -h | plot -h",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_args(p)
    add_load_args(p)
    p.add_argument("--plots", metavar="DIR", help="write PNG plots here")
    p.add_argument("--window", type=float, help="plot window in seconds (default: ~40 windows)")
    return p


def progress_bar(total: int | None, disable: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="req", disable=disable, dynamic_ncols=True, leave=False)


def cmd_run(argv: Sequence[str]) -> int:
    from surge.bench.client import RequestRecord
    from surge.bench.drive import RunResult, run
    from surge.bench.metrics import span_s
    from surge.bench.report import result_dict, save_result

    parser = run_parser()
    args = parser.parse_args(argv)
    try:
        config = bench_config(args, arrival_of(args))
        check_inputs(config)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    records: list[RequestRecord] = []
    started_at = time.time()
    try:
        with progress_bar(config.num_requests, args.no_progress) as bar:
            result = asyncio.run(run(config, on_done=lambda _: bar.update(), records=records))
    except KeyboardInterrupt:
        print("interrupted: the requests so far", file=sys.stderr)
        result = RunResult(config, records, started_at, span_s(records))
    report = summarize(result.records, config.slo, result.duration_s)
    title = f"{config.label or config.url} [{config.model}, {config.api}] {describe_load(config)}"
    print(format_table(report, title, config.slo))
    if args.output:
        save_result(args.output, result_dict(result, report))
        print(f"result: {args.output}")
    if args.plots:
        from surge.bench.plots import save_plots

        paths = save_plots(
            result.records,
            args.plots,
            duration_s=result.duration_s,
            arrival=config.arrival,
            window_s=args.window,
            title=config.label or describe_load(config),
        )
        print("plots: " + ", ".join(str(p) for p in paths))
    return 0 if report.num_ok else 1


def cmd_compare(argv: Sequence[str]) -> int:
    from surge.bench.compare import compare_table
    from surge.bench.report import load_result

    p = argparse.ArgumentParser(prog="surge bench compare", description="two runs side by side")
    p.add_argument("a", help="result JSON (the baseline)")
    p.add_argument("b", help="result JSON")
    args = p.parse_args(argv)
    print(compare_table(load_result(args.a), load_result(args.b), args.a, args.b))
    return 0


def cmd_plot(argv: Sequence[str]) -> int:
    from surge.bench.plots import save_plots
    from surge.bench.report import load_result, records_from

    p = argparse.ArgumentParser(prog="surge bench plot", description="plots from a result JSON")
    p.add_argument("result")
    p.add_argument("--plots", metavar="DIR", required=True)
    p.add_argument("--window", type=float)
    args = p.parse_args(argv)
    result = load_result(args.result)
    paths = save_plots(
        records_from(result),
        args.plots,
        duration_s=float(result["summary"]["duration_s"]),
        window_s=args.window,
        title=str(result.get("label") or ""),
    )
    print("plots: " + ", ".join(str(p) for p in paths))
    return 0


def sweep_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="surge bench sweep",
        description="Capacity: open-loop steps at rising rates until SLO attainment drops below "
        "--target (doubling from --start-rate, then bisection; or --rates in order), then the "
        "replicas for a peak: ceil(peak * (1 + headroom) / capacity). Or, with --concurrency, "
        "one closed-loop run per level.",
    )
    add_common_args(p)
    g = p.add_argument_group("sweep")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--rates", type=_spec(cfg.parse_float_list), help="e.g. 1,2,4,8")
    x.add_argument("--concurrency", type=_spec(cfg.parse_int_list), help="e.g. 1,8,32,64,128")
    g.add_argument("--start-rate", type=float, default=1.0)
    g.add_argument("--max-rate", type=float, default=float("inf"))
    g.add_argument("--bisections", type=int, default=4, help="after the first failure")
    g.add_argument("--target", type=float, default=0.9, help="SLO attainment that holds")
    g.add_argument("--arrival", choices=["poisson", "constant", "gamma"], default="poisson")
    g.add_argument("--cv", type=float, default=1.0)
    g.add_argument(
        "--requests-per-client",
        type=_positive_int,
        default=4,
        help="concurrency sweep: requests per level = this * level",
    )
    m = g.add_mutually_exclusive_group()
    m.add_argument(
        "--traffic",
        type=_spec(cfg.ArrivalConfig.parse),
        help="traffic model, e.g. sinusoid:base=2,peak=20,period=3600",
    )
    m.add_argument("--peak-rps", type=float, help="peak rate for replicas")
    g.add_argument("--headroom", type=float, default=0.2)
    return p


def cmd_sweep(argv: Sequence[str]) -> int:
    from surge.bench import sweep
    from surge.bench.report import save_result

    parser = sweep_parser()
    args = parser.parse_args(argv)
    levels = args.concurrency
    if levels is None and args.duration is None:
        args.duration = 30.0
    if args.drain is None:
        args.drain = 0.0 if levels else 10.0
    try:
        base = bench_config(args, None)
        check_inputs(base)
    except (ValueError, OSError) as e:
        parser.error(str(e))
    if levels is None and not base.slo.is_set:
        parser.error("a rate sweep needs --slo")
    print(sweep.ROW_HEADER)

    def show(row: sweep.SweepRow) -> None:
        print(sweep.format_row(row), flush=True)

    extra: dict[str, object] = {"config": config_dict(base)}
    if levels:
        rows = asyncio.run(
            sweep.concurrency_sweep(
                base,
                levels,
                num_requests=args.num_requests,
                requests_per_client=args.requests_per_client,
                on_row=show,
            )
        )
    else:
        shape = cfg.ArrivalConfig(args.arrival, cv=args.cv)
        rows = asyncio.run(
            sweep.rate_sweep(
                base,
                target=args.target,
                rates=args.rates or (),
                start_rps=args.start_rate,
                max_rps=args.max_rate,
                max_bisections=args.bisections,
                arrival=shape,
                on_row=show,
            )
        )
        capacity = sweep.capacity_of([(r.load, bool(r.passed)) for r in rows])
        extra |= {"target": args.target, "capacity_rps": capacity}
        print(f"capacity: {capacity:g} req/s at >= {args.target:.0%} SLO attainment")
        peak = (
            args.peak_rps
            if args.peak_rps is not None
            else (args.traffic.peak if args.traffic else None)
        )
        if peak is not None:
            n = sweep.replicas_needed(peak, args.headroom, capacity)
            extra |= {"peak_rps": peak, "headroom": args.headroom, "replicas": n}
            print(
                f"replicas: {n if n is not None else 'no rate held'} for a peak of {peak:g}"
                f" req/s with {args.headroom:.0%} headroom"
                f" (ceil({peak:g} * {1 + args.headroom:g} / {capacity:g}))"
            )
    if args.output:
        save_result(args.output, sweep.sweep_dict(rows, **extra))
        print(f"result: {args.output}")
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "compare":
        return cmd_compare(argv[1:])
    if argv and argv[0] == "sweep":
        return cmd_sweep(argv[1:])
    if argv and argv[0] == "plot":
        return cmd_plot(argv[1:])
    return cmd_run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
