"""`surge gateway`'s flags, now generated from GatewayConfig's fields, are the ones users'
scripts and the deploy manifests pass. gateway_flags.json was captured from the hand-written
flag table before (flag -> [argparse action, default, choices, nargs, value type]); every flag
defaults to None ("not given": the config file, else the dataclass default, holds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surge.gateway.cli import build_parser, config_from_args
from surge.gateway.config import HealthConfig
from tests.server.test_serve_flags import flag_table

EXPECTED = Path(__file__).with_name("gateway_flags.json")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_every_flag_keeps_its_name_default_and_kind() -> None:
    expected = json.loads(EXPECTED.read_text())
    actual = flag_table(build_parser())
    assert sorted(expected.keys() - actual.keys()) == []  # none dropped
    assert {flag: actual[flag] for flag in expected} == expected


def test_flags_override_the_file_and_the_rest_keep_its_values(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text("port = 9100\n[breaker]\nopen_s = 7.0\nmin_requests = 5\n")
    args = build_parser().parse_args(
        ["--config", str(path), "--upstream", "http://127.0.0.1:1", "--breaker-open", "3",
         "--no-stream-resume", "--max-in-flight-per-upstream", "4"]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.port == 9100 and config.breaker.open_s == 3.0  # the flag wins
    assert config.breaker.min_requests == 5  # the file's, no flag given
    assert config.retry.resume_streams is False and config.degrade.max_in_flight == 4
    assert config.health == HealthConfig()  # neither: the dataclass defaults
