"""deploy/prometheus: the rules load (`promtool check rules`) and behave as their unit tests say
(`promtool test rules`: burn-rate alerts fire and reset, the others fire on what they name)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.observability.prometheus_bin import binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy/prometheus"
RULES = [DEPLOY / "recording.rules.yml", DEPLOY / "alerts.rules.yml"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_check_rules() -> None:
    done = _run(binary("promtool"), "check", "rules", *map(str, RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_test_rules() -> None:
    tests = sorted((DEPLOY / "tests").glob("*.yml"))
    assert tests
    done = _run(binary("promtool"), "test", "rules", *map(str, tests))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_unit_test() -> None:
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(RULES[1].read_text())["groups"]
        for rule in group["rules"]
    }
    tested = {
        case["alertname"]
        for path in (DEPLOY / "tests").glob("*.yml")
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")  # one that fires, not only one that stays quiet
    }
    assert alerts == tested
