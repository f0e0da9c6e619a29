"""`surge autoscale recommend`: per-replica settings and the replica count for a peak, from a
capacity profile (the VPA side of autoscaling: what one replica should be, before how many).

- `--max-num-seqs`: the highest profiled concurrency whose mean TTFT and TPOT meet the SLO; more
  would run every sequence slower than the target (the rest wait in the queue instead).
- KV memory: that many sequences x (prompt + output tokens) x the model's bytes per token
  (`--kv-bytes-per-token`; SmolLM2-135M in bf16: 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 B =
  23,040), plus 25% for blocks partly filled and prefix sharing lost, rounded up to 1/8 GiB.
- CPU and memory requests: the cores the profiled replica had, and its resident memory (server
  and engine processes after the sweep) plus the KV cache above, rounded up to 1/4 GiB (both
  from the profile's "replica" entry, when measured).
- Replicas: ceil(peak x (1 + headroom) / one replica's rate at that concurrency).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any

from surge.fleetsim.args import slo
from surge.fleetsim.profile import CapacityProfile, load_profile, replicas_for

SMOLLM2_135M_KV_BYTES = 30 * 3 * 64 * 2 * 2


def recommend(
    profile: CapacityProfile,
    peak_rps: float,
    ttft_s: float | None,
    tpot_s: float | None,
    headroom: float = 0.2,
    kv_bytes_per_token: int = SMOLLM2_135M_KV_BYTES,
) -> dict[str, Any]:
    seqs = int(profile.max_level_within(ttft_s, tpot_s))
    per_replica = profile.rps_at(seqs)
    context = profile.prompt_tokens + profile.output_tokens
    kv_gib = seqs * context * kv_bytes_per_token * 1.25 / 2**30
    kv_gib = max(0.125, math.ceil(kv_gib * 8) / 8)
    rep = profile.replica or {}
    memory_gib = None
    if "rss_gib" in rep:
        # The KV pool is touched lazily: the measured RSS holds little of it, so add it whole.
        memory_gib = math.ceil((rep["rss_gib"] + kv_gib) * 4) / 4
    meets = (ttft_s is None or profile.ttft(seqs) <= ttft_s) and (
        tpot_s is None or profile.tpot(seqs) <= tpot_s
    )
    return {
        "max_num_seqs": seqs,
        "meets_slo": meets,
        "ttft_s": profile.ttft(seqs),
        "tpot_s": profile.tpot(seqs),
        "replica_rps": per_replica,
        "kv_cache_memory_gib": kv_gib,
        "cpu_request": rep.get("cpus"),
        "memory_request_gib": memory_gib,
        "replicas": replicas_for(peak_rps, per_replica, headroom),
        "peak_rps": peak_rps,
        "headroom": headroom,
        "cold_start_s": profile.start_s,
    }


def format_recommendation(r: dict[str, Any]) -> str:
    cpu = "-" if r["cpu_request"] is None else f"{r['cpu_request']:g}"
    mem = "-" if r["memory_request_gib"] is None else f"{r['memory_request_gib']:g}Gi"
    verdict = "meets the SLO" if r["meets_slo"] else "MISSES the SLO even at 1 sequence"
    return "\n".join(
        [
            f"per replica: --max-num-seqs {r['max_num_seqs']} (TTFT {r['ttft_s']:.3f} s, TPOT "
            f"{r['tpot_s'] * 1000:.0f} ms there: {verdict}), {r['replica_rps']:.2f} req/s",
            f"  --kv-cache-memory-gib {r['kv_cache_memory_gib']:g}",
            f"  requests: cpu {cpu}, memory {mem}",
            f"replicas: {r['replicas']} for a peak of {r['peak_rps']:g} req/s with "
            f"{r['headroom']:.0%} headroom (ceil({r['peak_rps']:g} x {1 + r['headroom']:g} / "
            f"{r['replica_rps']:.2f}))",
            f"surge autoscale --target-ongoing {r['max_num_seqs']} --max-replicas {r['replicas']} "
            f"--forecast-horizon {r['cold_start_s'] + 2:g} -- --max-num-seqs {r['max_num_seqs']} "
            f"--kv-cache-memory-gib {r['kv_cache_memory_gib']:g}",
        ]
    )


def cmd_recommend(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="surge autoscale recommend",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--profile", required=True, help="surge bench sweep --concurrency --output")
    p.add_argument("--peak-rps", type=float, required=True)
    p.add_argument("--slo", type=slo, required=True, help="e.g. ttft=2s,tpot=100ms")
    p.add_argument("--headroom", type=float, default=0.2)
    p.add_argument("--kv-bytes-per-token", type=int, default=SMOLLM2_135M_KV_BYTES)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not args.peak_rps > 0:
        p.error("--peak-rps must be > 0")
    try:
        profile = load_profile(args.profile)
    except (ValueError, OSError) as e:
        p.error(str(e))
    r = recommend(
        profile,
        args.peak_rps,
        args.slo.ttft_s,
        args.slo.tpot_s,
        args.headroom,
        args.kv_bytes_per_token,
    )
    print(json.dumps(r, indent=2) if args.json else format_recommendation(r))
    return 0
