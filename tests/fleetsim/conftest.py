"""A capacity profile written here in the format `surge bench sweep --concurrency --output`
writes: a replica that holds TTFT 2 s and TPOT 100 ms up to 8 sequences (2 req/s there) and
starts in 10 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# concurrency, TTFT mean (s), TPOT mean (s); 64 output tokens per request
LEVELS = [(1, 0.05, 0.02), (2, 0.07, 0.025), (4, 0.1, 0.035), (8, 0.2, 0.06), (16, 0.5, 0.11)]


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    rows = []
    for c, ttft, tpot in LEVELS:
        summary = {
            "num_ok": 10, "num_output_tokens": 640, "num_prompt_tokens": 1280,
            "request_rps": c / (ttft + 63 * tpot),
            "ttft": {"mean": ttft, "p50": ttft}, "tpot": {"mean": tpot, "p50": tpot},
        }  # fmt: skip
        rows.append({"load": c, "passed": None, "summary": summary})
    path = tmp_path / "profile.json"
    replica = {"start_s": 10.0, "cpus": 2, "rss_gib": 2.5, "kv_cache_gib": 2.0}
    path.write_text(json.dumps({"rows": rows, "replica": replica}))
    return path
