"""The overload burst: N streaming completions sent at once to a running `surge serve`, and what
the server did with them: refused (and how fast, server-side: surge:admission_refusal_seconds),
admitted and finished, or shed at --max-queue-wait; the first-token waits of the admitted ones
against the bound, client-side and server-side (surge:queue_wait_observed_seconds).

    surge serve --model smollm2-135m --port 8000 &    # the defaults: --max-queue-wait 30
    python benchmarks/burst.py --url http://127.0.0.1:8000 --num 2000 --max-tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.reliability.burst import burst


def histogram(url: str, name: str) -> dict[str, float]:
    """{le: cumulative count} and count of a histogram on /metrics."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in fam.samples:
            if s.name == name + "_bucket":
                out[s.labels["le"]] = s.value
            elif s.name == name + "_count":
                out["count"] = s.value
    return out


def quantile(hist: dict[str, float], q: float) -> str:
    """The bucket edge under which a share q of the observations lie ('<= edge')."""
    total = hist.get("count", 0)
    for le, n in sorted(((k, v) for k, v in hist.items() if k != "count"),
                        key=lambda kv: float(kv[0])):  # fmt: skip
        if total and n >= q * total:
            return f"<= {le} s"
    return "n/a"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the server's first model")
    p.add_argument("--num", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--warmup", type=int, default=4, help="requests first, to measure the engine")
    args = p.parse_args()
    model = args.model or httpx.get(args.url + "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": "Tell me a long story about a river.",
            "max_tokens": args.max_tokens, "ignore_eos": True, "stream": True}  # fmt: skip
    asyncio.run(burst(args.url, args.warmup, body))
    t0 = time.monotonic()
    outs = asyncio.run(burst(args.url, args.num, body))
    wall = time.monotonic() - t0
    refused = [o for o in outs if o.status != 200]
    shed = [o for o in outs if o.status == 200 and o.error is not None]
    done = [o for o in outs if o.status == 200 and o.error is None and o.finished]
    ttft = sorted(o.ttft_s for o in done if o.ttft_s is not None)
    refusal = histogram(args.url, "surge:admission_refusal_seconds")
    waits = histogram(args.url, "surge:queue_wait_observed_seconds")
    ratio = histogram(args.url, "surge:queue_wait_observed_over_estimate")
    report = {
        "num": args.num, "wall_s": round(wall, 1), "finished": len(done), "refused": len(refused),
        "refused_codes": sorted({str((o.error or {}).get("error", {}).get("code"))  # type: ignore[union-attr]
                                 for o in refused}),
        "shed_at_bound": len(shed), "other": args.num - len(done) - len(refused) - len(shed),
        "refusal_client_max_s": round(max((o.elapsed_s for o in refused), default=0), 3),
        "refusal_server_p50": quantile(refusal, 0.5), "refusal_server_p99": quantile(refusal, 0.99),
        "ttft_client_p50_s": round(ttft[len(ttft) // 2], 2) if ttft else None,
        "ttft_client_max_s": round(ttft[-1], 2) if ttft else None,
        "wait_server_p99": quantile(waits, 0.99), "wait_server_max_bucket": quantile(waits, 1.0),
        "observed_over_estimate_p50": quantile(ratio, 0.5),
        "observed_over_estimate_p90": quantile(ratio, 0.9),
    }  # fmt: skip
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
