"""Config validation, config files and the command line that builds the config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from surge.gateway.cli import build_parser, config_from_args, parse_upstream
from surge.gateway.config import (
    BreakerConfig,
    DegradeAction,
    DegradeConfig,
    GatewayConfig,
    Policy,
    UpstreamConfig,
)
from surge.gateway.config_file import config_from_mapping, read_upstreams_file

U1, U2 = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


def test_defaults_and_url_normalisation() -> None:
    cfg = GatewayConfig(upstreams=(UpstreamConfig(U1 + "/"),))
    assert cfg.policy is Policy.PREFIX and cfg.upstreams[0].url == U1
    assert cfg.degrade.action is DegradeAction.NONE


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: GatewayConfig(), "upstreams"),
        (lambda: UpstreamConfig("127.0.0.1:8000"), "upstream url"),
        (lambda: UpstreamConfig(U1, weight=0), "weight"),
        (lambda: GatewayConfig(upstreams=(UpstreamConfig(U1),) * 2), "upstreams"),
        (lambda: GatewayConfig(upstreams=(UpstreamConfig(U1),), port=0), "port"),
        (lambda: GatewayConfig(upstreams=(UpstreamConfig(U1),), policy="random"), "random"),
        (lambda: BreakerConfig(failure_rate=1.5), "failure_rate"),
        (lambda: DegradeConfig(shed_status=500), "shed_status"),
        (
            lambda: GatewayConfig(
                upstreams=(UpstreamConfig(U1),), degrade=DegradeConfig(action="fallback")
            ),
            "fallback_upstreams",
        ),
    ],
)
def test_bad_values_are_rejected_with_the_field_name(make: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()  # type: ignore[operator]


def test_config_from_mapping_nested_and_strict() -> None:
    cfg = config_from_mapping({
        "port": 9000, "policy": "session",
        "upstreams": [U1, {"url": U2, "weight": 3}],
        "breaker": {"failure_threshold": 2, "open_s": 5},
        "timeouts": {"idle_s": 3},
    })  # fmt: skip
    assert cfg.port == 9000 and cfg.policy is Policy.SESSION
    assert cfg.upstreams[1] == UpstreamConfig(U2, weight=3.0)
    assert cfg.breaker.failure_threshold == 2 and cfg.timeouts.idle_s == 3.0
    with pytest.raises(ValueError, match="unknown"):
        config_from_mapping({"upstreams": [U1], "brekaer": {}})
    with pytest.raises(ValueError, match="breaker: unknown keys"):
        config_from_mapping({"upstreams": [U1], "breaker": {"threshold": 1}})
    with pytest.raises(ValueError, match=r"breaker\.open_s"):
        config_from_mapping({"upstreams": [U1], "breaker": {"open_s": "5"}})


def test_upstreams_file_formats(tmp_path: Path) -> None:
    text = tmp_path / "ups.txt"
    text.write_text(f"# fleet\n{U1}\n{U2} 2.5  # bigger box\n\n")
    assert read_upstreams_file(text) == ((UpstreamConfig(U1), UpstreamConfig(U2, weight=2.5)), ())
    js = tmp_path / "ups.json"
    js.write_text(json.dumps({"upstreams": [U1], "fallback_upstreams": [{"url": U2}]}))
    assert read_upstreams_file(js) == ((UpstreamConfig(U1),), (UpstreamConfig(U2),))
    js.write_text(json.dumps([U2]))
    assert read_upstreams_file(js) == ((UpstreamConfig(U2),), ())
    toml = tmp_path / "ups.toml"
    toml.write_text(f'[[upstreams]]\nurl = "{U1}"\nmax_in_flight = 4\n')
    assert read_upstreams_file(toml) == ((UpstreamConfig(U1, max_in_flight=4),), ())
    text.write_text(f"{U1} heavy\n")
    with pytest.raises(ValueError, match="bad weight"):
        read_upstreams_file(text)


def test_cli_flags_override_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        f'port = 9100\npolicy = "round_robin"\nupstreams = ["{U1}"]\n'
        "[breaker]\nfailure_threshold = 7\nopen_s = 3.0\n"
    )
    args = build_parser().parse_args([
        "--config", str(path), "--port", "9200", "--breaker-open", "9",
        "--upstream", f"{U2},weight=2,max_in_flight=3", "--degrade", "cap_max_tokens",
        "--degrade-max-tokens", "16",
    ])  # fmt: skip
    cfg = config_from_args(args)
    assert cfg.port == 9200 and cfg.policy is Policy.ROUND_ROBIN
    assert cfg.breaker.failure_threshold == 7 and cfg.breaker.open_s == 9.0
    assert cfg.upstreams == (UpstreamConfig(U2, weight=2.0, max_in_flight=3),)
    assert cfg.degrade.action is DegradeAction.CAP_MAX_TOKENS and cfg.degrade.max_tokens_cap == 16


def test_parse_upstream_rejects_unknown_options() -> None:
    assert parse_upstream(U1) == {"url": U1}
    with pytest.raises(ValueError, match="options"):
        parse_upstream(U1 + ",priority=1")


def test_main_reports_bad_config_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    from surge.gateway.cli import main

    assert main(["--upstream", "nonsense"]) == 2
    assert "upstream url" in capsys.readouterr().err
