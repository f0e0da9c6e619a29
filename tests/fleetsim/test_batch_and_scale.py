"""The fleet simulator with batch work, HPA's stabilization, and at a public service's scale,
on short spans (seconds each):

- a batch whose window its leftover capacity cannot meet gets replicas (and meets it), one its
  leftover meets gets none; the same tight batch with the batch signal held back misses;
- HPA's stabilization (a 300 s down window, rate policies per 15 s) changes the count several
  times less often than Surge's per-decision defaults, at no loss of SLO attainment;
- the fluid mode's answer does not hang on its step: 1 s steps agree with 0.1 s steps where
  rounding each request's time to whole steps once met the SLO for 0.83 of requests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from surge.autoscale.config import AutoscalerConfig
from surge.fleetsim.batch import BatchQueue, BatchSpec, parse_span
from surge.fleetsim.profile import load_profile
from surge.fleetsim.simulate import SimConfig, simulate, with_defaults
from surge.fleetsim.traffic import Traffic

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "profiles" / "smollm2-135m-cpu.json"


def run(
    profile: Path,
    traffic: str,
    duration: float,
    policies: tuple[str, ...],
    *,
    mode: str = "requests",
    batches: tuple[str, ...] = (),
    step: float = 1.0,
    stabilizations: tuple[str, ...] = ("surge",),
    **auto: Any,
) -> dict[str, Any]:
    prof = load_profile(profile)
    config = AutoscalerConfig(max_replicas=3000, **auto)
    config = with_defaults(config, prof, 2.0, 0.1, None)
    sim = SimConfig(
        Traffic.parse(traffic),
        prof,
        config,
        duration,
        0.0,
        2.0,
        0.1,
        policies,
        mode,
        batches=tuple(BatchSpec.parse(b) for b in batches),
        fluid_step_s=step,
        stabilizations=stabilizations,
    )
    return simulate(sim).to_dict()["policies"]


def test_a_batch_spec_reads_as_documented_and_refuses_nonsense() -> None:
    spec = BatchSpec.parse("lines=5000,tokens=200,window=6h,at=14:00,every=1d")
    assert (spec.lines, spec.tokens, spec.window_s, spec.at_s, spec.every_s) == (
        5000,
        200,
        6 * 3600,
        14 * 3600,
        86400,
    )
    jobs = spec.jobs(2 * 86400)
    assert [(j.submit_s, j.deadline_s) for j in jobs] == [(50400, 72000), (136800, 158400)]
    assert parse_span("90m") == parse_span("1.5h") == parse_span("01:30") == 5400
    for bad in (
        "lines=10",
        "lines=10,window=1h,colour=red",
        "lines=0,window=1h",
        "lines=10,window=soon",
    ):
        with pytest.raises(ValueError, match="batch"):
            BatchSpec.parse(bad)
    with pytest.raises(ValueError, match="no window closes"):
        BatchQueue((BatchSpec.parse("lines=10,window=2h,at=23h"),), 86400)


BATCH_LOAD = "poisson:rate=10"  # ~5 replicas of the test profile (2 req/s each at 8 ongoing)


def test_a_tight_window_gets_replicas_and_a_loose_one_none(profile_path: Path) -> None:
    # Leftover capacity runs ~5 lines a second: 5,000 lines take ~16 minutes of it.
    args = (profile_path, BATCH_LOAD, 70 * 60.0, ("reactive",))
    alone = run(*args)["reactive"]
    loose = run(*args, batches=("lines=5000,tokens=64,window=60m,at=5m",), batch_margin_s=120.0)[
        "reactive"
    ]
    tight = run(*args, batches=("lines=5000,tokens=64,window=10m,at=5m",), batch_margin_s=120.0)[
        "reactive"
    ]
    assert alone["batch"] is None
    assert loose["batch"]["window_attainment"] == 1.0
    assert loose["batch"]["scale_ups_for_batch"] == 0, loose  # the leftover was enough
    assert loose["max_replicas"] <= alone["max_replicas"]
    assert tight["batch"]["window_attainment"] == 1.0, tight
    assert tight["batch"]["hours_to_finish"][0] <= 10 / 60
    assert tight["batch"]["scale_ups_for_batch"] >= 1
    assert tight["max_replicas"] >= loose["max_replicas"] + 2, (tight, loose)
    for s in (loose, tight):  # the interactive requests keep their SLO beside the batch
        assert s["slo_attainment"] >= alone["slo_attainment"] - 0.01
    # The batch signal held back past the window (judged after an hour): the same batch misses.
    held = run(
        *args,
        batches=("lines=5000,tokens=64,window=10m,at=5m",),
        batch_margin_s=120.0,
        batch_window_s=3600.0,
    )["reactive"]
    assert held["batch"]["window_attainment"] == 0.0 and held["batch"]["lines_done"] == 5000


def test_the_fluid_mode_runs_batches_by_the_same_rule(profile_path: Path) -> None:
    args = (profile_path, BATCH_LOAD, 70 * 60.0, ("reactive",))
    loose = run(
        *args,
        mode="fluid",
        batches=("lines=5000,tokens=64,window=60m,at=5m",),
        batch_margin_s=120.0,
    )["reactive"]
    tight = run(
        *args,
        mode="fluid",
        batches=("lines=5000,tokens=64,window=10m,at=5m",),
        batch_margin_s=120.0,
    )["reactive"]
    assert loose["batch"]["window_attainment"] == 1.0
    assert loose["batch"]["scale_ups_for_batch"] == 0
    assert tight["batch"]["window_attainment"] == 1.0 and tight["batch"]["scale_ups_for_batch"]


def test_hpa_stabilization_cuts_scale_events(profile_path: Path) -> None:
    s = run(
        profile_path,
        "sinusoid:base=2,peak=20,period=1800",
        3600.0,
        ("reactive", "oracle"),
        stabilizations=("surge", "hpa", "hpa-pods"),
    )
    for name in ("reactive", "oracle"):
        surge, hpa, pods = s[f"{name}@surge"], s[f"{name}@hpa"], s[f"{name}@hpa-pods"]
        for stable in (hpa, pods):
            assert stable["scale_events"] * 3 <= surge["scale_events"], (name, stable, surge)
            assert stable["slo_attainment"] >= surge["slo_attainment"] - 0.01, (name, stable)
            assert stable["replica_hours"] <= surge["replica_hours"] * 1.1, (name, stable)


def test_the_fluid_step_does_not_decide_the_answer() -> None:
    # 100-1000 req/s on the shipped SmolLM2 profile: 0.4-0.7 s requests, shorter than a step.
    args = (SHIPPED, "sinusoid:base=100,peak=1000,period=3600", 3600.0, ("reactive",))
    coarse = run(*args, mode="fluid", step=1.0)["reactive"]
    fine = run(*args, mode="fluid", step=0.1)["reactive"]
    assert coarse["slo_attainment"] >= 0.95, coarse
    assert abs(coarse["slo_attainment"] - fine["slo_attainment"]) <= 0.03, (coarse, fine)
    assert abs(coarse["replica_hours"] - fine["replica_hours"]) <= 0.1 * fine["replica_hours"]


def test_the_cli_reports_batch_windows(profile_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "surge.cli",
        "autoscale",
        "simulate",
        "--traffic",
        BATCH_LOAD,
        "--duration",
        "30m",
        "--profile",
        str(profile_path),
        "--policies",
        "reactive",
        "--batch",
        "lines=500,tokens=64,window=20m,at=2m",
        "--batch-margin",
        "2m",
        "--stabilization",
        "surge,hpa",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "windows met" in out and "reactive@hpa" in out and "100%" in out, out
    bad = subprocess.run(
        [*cmd[:-4], "--batch", "lines=5,window=2h,at=29m"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "no window closes" in bad.stderr
