"""`surge serve`'s flags, now generated from EngineConfig's and ServerConfig's fields, are the
ones users' scripts and the deploy manifests pass: same names, defaults and kinds.

serve_flags.json was captured from the hand-written parsers before the flags were generated
(flag -> [argparse action, default, choices, nargs, value type]); a flag dropped or renamed,
or a default changed, fails here. New flags may be added."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from surge.cli.main import build_parser, engine_config
from surge.cli.serve import server_config
from surge.engine.config import EngineConfig
from surge.observability.tracing import TracingConfig
from surge.server.config import ObservabilityConfig, ServerConfig

EXPECTED = Path(__file__).with_name("serve_flags.json")
ENV = ("SURGE_MODEL", "SURGE_API_KEY", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
       "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
       "OTEL_EXPORTER_OTLP_PROTOCOL")  # fmt: skip


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:  # the defaults some flags take from the environment
        monkeypatch.delenv(name, raising=False)


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices["serve"]
    return parser


def _kind(t: Any) -> str:
    return {None: "str", int: "int", float: "float", str: "str"}.get(t, "parsed")


def flag_table(parser: argparse.ArgumentParser) -> dict[str, list[Any]]:
    rows = {}
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        choices = sorted(a.choices) if a.choices else None
        for option in a.option_strings:
            rows[option] = [type(a).__name__, a.default, choices, a.nargs, _kind(a.type)]
    return json.loads(json.dumps(rows))  # tuples as lists, as in the file


def test_every_flag_keeps_its_name_default_and_kind() -> None:
    expected = json.loads(EXPECTED.read_text())
    actual = flag_table(serve_parser())
    assert sorted(expected.keys() - actual.keys()) == []  # none dropped
    assert {flag: actual[flag] for flag in expected} == expected


def test_help_has_one_group_per_config_part() -> None:
    parser = serve_parser()
    titled = {
        g.title: {o for a in g._group_actions for o in a.option_strings}
        for g in parser._action_groups
    }
    for title, flag in [("model", "--dtype"), ("KV cache", "--block-size"),
                        ("scheduler", "--scheduling-policy"), ("server", "--port"),
                        ("API keys and tenants", "--api-key"),
                        ("admission (queue bounds and rate limits)", "--max-queue-wait"),
                        ("timeouts and limits", "--request-timeout"),
                        ("chat template and tool calls", "--tool-call-parser"),
                        ("observability (request log, OpenTelemetry traces)",
                         "--otlp-traces-endpoint")]:  # fmt: skip
        assert flag in titled[title], (title, flag)
    assert titled["options"] == {"-h", "--help"}  # every flag is in a group of its own part
    text = parser.format_help()
    kv = text.index("\nKV cache:\n")  # the help lists a group's flags under its title
    assert text.index("\n  --block-size", kv) < text.index("\nscheduler:\n")


def test_no_flags_build_the_dataclass_defaults() -> None:
    """The defaults live in one place: the configs. Flags left out give exactly them."""
    args = serve_parser().parse_args([])
    assert engine_config(args) == EngineConfig()
    tracing = TracingConfig(service_name="surge-server", instance_id="127.0.0.1:8000")
    assert server_config(args) == dataclasses.replace(
        ServerConfig(), observability=ObservabilityConfig(tracing=tracing)
    )


def test_flags_reach_the_nested_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    args = serve_parser().parse_args(
        ["--model", "m", "--no-prefix-caching", "--priority-aging-s", "0", "--tenant-weight",
         "a=2", "--request-timeout", "0", "--max-queue-wait", "2.5", "--tenant-header", "X-T",
         "--embedding-preferred-batch-sizes", "4,8", "--embedding-max-queue-delay-ms", "5",
         "--embedding-max-batch-tokens", "64", "--api-key", "k1", "--api-key", "k2",
         "--speculative-config", '{"num_speculative_tokens": 3}']
    )  # fmt: skip
    engine, server = engine_config(args), server_config(args)
    assert engine.model.model == "m" and not engine.cache.enable_prefix_caching
    assert engine.scheduler.priority_aging_s is None  # 0 on the command line: no aging
    assert engine.scheduler.tenant_weights == (("a", 2.0),)
    assert engine.speculative.num_speculative_tokens == 3
    assert server.served_model_name == "m"  # defaults to --model
    assert server.limits.request_timeout_s is None and server.admission.max_queue_wait_s == 2.5
    assert server.auth.tenant_header == "x-t" and server.auth.api_keys == {"k1", "k2"}
    batcher = server.embeddings.batcher
    assert batcher.preferred_batch_sizes == (4, 8) and batcher.max_queue_delay_s == 0.005
    assert batcher.max_batch_cost == 64
    monkeypatch.setenv("SURGE_MODEL", "from-env")
    monkeypatch.setenv("SURGE_API_KEY", "env-key")
    args = serve_parser().parse_args([])
    assert engine_config(args).model.model == "from-env"
    assert server_config(args).auth.api_keys == {"env-key"}
    assert server_config(serve_parser().parse_args(["--api-key", "k"])).auth.api_keys == {"k"}
