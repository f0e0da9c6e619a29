"""The bench against a real `surge serve` on loopback (tiny random Llama): both loops, errors,
the duration cap, prefix caching, the CLI as a subprocess, compare and a sweep."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from surge.bench import cli
from surge.bench.client import RequestRecord
from surge.bench.config import ArrivalConfig, BenchConfig, LengthDist, Slo, WorkloadConfig
from surge.bench.drive import run
from surge.bench.metrics import summarize
from surge.bench.sweep import concurrency_sweep, rate_sweep
from tests.servers import ServerProcess, free_port


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tiny_model_dir, "--dtype", "float32")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def tokenizer_path(tiny_model_dir: Path) -> str:
    return str(tiny_model_dir / "tokenizer.json")


def config(url: str, tokenizer_path: str | None = None, **kw: object) -> BenchConfig:
    workload = WorkloadConfig(
        input_len=LengthDist("uniform", 8, 32), output_len=LengthDist("fixed", 8),
        tokenizer_path=tokenizer_path,
    )  # fmt: skip
    return dataclasses.replace(
        BenchConfig(url, "test-model", num_requests=1, workload=workload), **kw
    )


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    # At equal times an end comes before a start: a closed-loop client sends after its answer.
    events = sorted(
        [(r.send_s, 1) for r in records if r.send_s is not None]
        + [(r.done_s, -1) for r in records if r.done_s is not None]
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


async def test_closed_loop(server: ServerProcess, tokenizer_path: str) -> None:
    result = await run(config(server.url, tokenizer_path, concurrency=4, num_requests=12))
    rs = result.records
    assert len(rs) == 12 and all(r.ok for r in rs), [r.error for r in rs]
    assert max_in_flight(rs) == 4
    assert all(r.output_tokens == 8 and r.num_output_tokens == 8 for r in rs)
    # exact prompt lengths: the tokenizer's count is the server's
    assert all(r.num_prompt_tokens == r.input_len for r in rs)
    assert all(0 < len(r.chunk_s) <= 8 and r.ttft_s and r.ttft_s > 0 for r in rs)
    assert all(r.scheduled_s is None for r in rs)
    report = summarize(rs, Slo(e2e_s=60.0), result.duration_s)
    assert report.num_ok == 12 and report.num_output_tokens == 96
    assert report.goodput is not None and report.goodput.fraction_met == 1.0
    assert report.ttft.count == 12 and report.itl.count > 0


async def test_chat_api_skips_the_role_chunk(server: ServerProcess) -> None:
    result = await run(config(server.url, api="chat", concurrency=2, num_requests=3))
    assert all(r.ok and r.num_output_tokens == 8 and len(r.chunk_s) <= 8 for r in result.records)


async def test_open_loop_poisson(server: ServerProcess) -> None:
    arrival = ArrivalConfig("poisson", rate_rps=25.0)
    result = await run(config(server.url, concurrency=None, arrival=arrival, num_requests=15))
    rs = result.records
    assert len(rs) == 15 and all(r.ok for r in rs)
    scheduled = [r.scheduled_s for r in rs]
    assert all(s is not None for s in scheduled) and scheduled == sorted(scheduled)  # type: ignore[type-var]
    lateness = [r.lateness_s for r in rs]
    assert all(x is not None and 0 <= x < 1.0 for x in lateness), lateness
    # the same seed gives the same schedule
    again = await run(config(server.url, concurrency=None, arrival=arrival, num_requests=15))
    assert [r.scheduled_s for r in again.records] == scheduled


async def test_errors_are_recorded(server: ServerProcess) -> None:
    bad_model = dataclasses.replace(config(server.url, num_requests=2), model="no-such-model")
    rs = (await run(bad_model)).records
    assert all(r.status == 404 and r.error_type == "http_404" and r.error for r in rs)
    down = (await run(config(f"http://127.0.0.1:{free_port()}", num_requests=2))).records
    assert all(r.status is None and r.error_type == "ConnectError" for r in down)
    assert summarize(down).errors == {"ConnectError": 2}


async def test_duration_cap_cancels_in_flight(server: ServerProcess) -> None:
    long = config(server.url, concurrency=2, num_requests=50, duration_s=0.4)
    long = dataclasses.replace(
        long, workload=dataclasses.replace(long.workload, output_len=LengthDist("fixed", 1500))
    )
    result = await run(long)
    assert result.duration_s < 3.0
    report = summarize(result.records)
    assert report.num_cancelled >= 1 and report.num_errors == 0
    assert all(r.cancelled for r in result.records if not r.ok)


async def test_shared_prefix_hits_the_prefix_cache(
    server: ServerProcess, tokenizer_path: str
) -> None:
    c = config(server.url, tokenizer_path, concurrency=1, num_requests=8, seed=11)
    c = dataclasses.replace(
        c, workload=dataclasses.replace(c.workload, num_prefix_groups=2, prefix_len=64)
    )
    rs = (await run(c)).records
    seen: set[int | None] = set()
    for r in rs:
        assert r.ok and r.num_cached_tokens is not None
        if r.group in seen:  # 64 shared tokens = 4 full blocks of 16
            assert r.num_cached_tokens >= 48, (r.group, r.num_cached_tokens)
        seen.add(r.group)


def test_cli_run_json_plots_and_compare(
    server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, plots = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "plots"
    common = ["--url", server.url, "--input-len", "16", "--output-len", "8", "--no-progress"]
    cmd = [sys.executable, "-m", "surge.cli", "bench", *common, "--concurrency", "2",
           "--num-requests", "6", "--tenants", "a:1,b:1", "--slo", "ttft=10s,tpot=1s",
           "--label", "closed", "--output", str(a), "--plots", str(plots)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "goodput" in proc.stdout
    result = json.loads(a.read_text())
    assert result["config"]["model"] == "test-model"  # discovered from /v1/models
    assert result["config"]["concurrency"] == 2
    assert result["summary"]["num_ok"] == 6 and len(result["records"]) == 6
    assert set(result["summary"]["by_tenant"]) <= {"a", "b"}
    assert result["summary"]["goodput"]["fraction_met"] == 1.0
    assert len(result["records"][0]["chunk_s"]) > 0
    for name in ("load.png", "latency_over_time.png", "cdf.png", "tenants.png"):
        assert (plots / name).stat().st_size > 1000, name

    argv = [*common, "--model", "test-model", "--rate", "30", "--num-requests", "6",
            "--label", "open", "--output", str(b)]  # fmt: skip
    assert cli.main(argv) == 0
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "closed" in out and "open" in out and "B / A" in out and "TTFT p50" in out


async def test_sweeps(server: ServerProcess) -> None:
    base = config(server.url, concurrency=1, num_requests=None, duration_s=30.0)
    rows = await concurrency_sweep(base, [1, 3], requests_per_client=2)
    assert [(r.load, r.report.num_ok) for r in rows] == [(1, 2), (3, 6)]
    held = await rate_sweep(
        dataclasses.replace(base, slo=Slo(e2e_s=30.0), duration_s=0.5, drain_s=5.0),
        target=0.9,
        rates=(4.0, 8.0),
    )
    assert [r.load for r in held] == [4.0, 8.0] and all(r.passed for r in held)


def test_cli_rejects_bad_specs_and_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--url", "http://127.0.0.1:1", "--model", "m"]
    with pytest.raises(SystemExit):
        cli.main([*target, "--slo", "ttft=fast"])
    assert "bad duration" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"prompt": 3}\n')
    with pytest.raises(SystemExit):  # before any request is sent
        cli.main([*target, "--dataset", str(tmp_path / "bad.jsonl")])
    assert "row 1: prompt must be a string" in capsys.readouterr().err
