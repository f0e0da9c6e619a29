"""surge/config/flags.py: a config field with flag metadata is a flag, in its config's group, and
the parsed flags build the config back; a new option is one field."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import pytest

from surge.config.flags import (
    add_config_args,
    config_from_args,
    each,
    flag,
    group,
    overrides_from_args,
)
from surge.server.config import AdmissionConfig, ServerConfig


def _ms(value: float) -> float:
    return value / 1e3


@dataclass(frozen=True, slots=True)
class Inner:
    size: int = field(default=3, metadata=flag("how many"))
    delay_s: float = field(default=0.0, metadata=flag(name="delay-ms", to_field=_ms))
    hidden: int = 9  # no metadata: no flag


@dataclass(frozen=True, slots=True)
class Outer:
    name: str = field(default="a", metadata=flag("which", choices=("a", "b")))
    limit: int | None = field(default=None, metadata=flag())
    fast: bool = field(default=True, metadata=flag(name="no-fast", negate=True))
    verbose: bool = field(default=False, metadata=flag())
    tags: tuple[str, ...] = field(default=(), metadata=flag(name="tag", repeat=True))
    pairs: tuple[tuple[str, int], ...] = field(default=(), metadata=flag(
        nargs="+", to_field=each(lambda t: (t.split("=")[0], int(t.split("=")[1])))))  # fmt: skip
    inner: Inner = field(default_factory=Inner, metadata=group("inner part", prefix="in-"))


def _parser(cls: type, *, unset: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_args(p, cls, "outer", unset=unset)
    return p


def test_fields_with_metadata_become_grouped_flags_and_build_the_config() -> None:
    p = _parser(Outer)
    groups = {g.title: [o for a in g._group_actions for o in a.option_strings]
              for g in p._action_groups}  # fmt: skip
    assert groups["outer"] == ["--name", "--limit", "--no-fast", "--verbose", "--tag", "--pairs"]
    assert groups["inner part"] == ["--in-size", "--in-delay-ms"]  # `hidden` has no flag
    assert config_from_args(Outer, p.parse_args([]), "outer") == Outer()
    args = p.parse_args(["--name", "b", "--limit", "4", "--no-fast", "--verbose", "--tag", "x",
                         "--tag", "y", "--pairs", "p=1", "q=2", "--in-size", "5",
                         "--in-delay-ms", "250"])  # fmt: skip
    assert config_from_args(Outer, args, "outer") == Outer(
        name="b", limit=4, fast=False, verbose=True, tags=("x", "y"),
        pairs=(("p", 1), ("q", 2)), inner=Inner(size=5, delay_s=0.25),
    )  # fmt: skip
    overridden = config_from_args(Outer, p.parse_args([]), "outer", {"inner.hidden": 1})
    assert overridden.inner == Inner(hidden=1)
    with pytest.raises(SystemExit):
        p.parse_args(["--name", "c"])  # choices
    with pytest.raises(SystemExit):
        p.parse_args(["--limit", "x"])  # the annotation's type parses the value


def test_a_field_added_to_a_server_config_part_becomes_a_flag() -> None:
    """The promise: one field with metadata, and `surge serve` has the flag, in the part's
    group, with the field's default, and the built config carries the value."""
    knob = field(default=7, metadata=flag("a new bound"))
    Admission = dataclasses.make_dataclass(
        "Admission", [("max_new_knob", int, knob)], bases=(AdmissionConfig,), frozen=True
    )
    Server = dataclasses.make_dataclass(
        "Server",
        [("admission", Admission, field(
            default_factory=Admission, metadata=group("admission (queue bounds and rate limits)")
        ))],
        bases=(ServerConfig,),
        frozen=True,
    )  # fmt: skip
    p = argparse.ArgumentParser()
    add_config_args(p, Server, "server")
    (action,) = [a for a in p._actions if "--max-new-knob" in a.option_strings]
    assert action.default == 7 and action.help == "a new bound" and action.type is int
    (admission,) = [g for g in p._action_groups if g.title and g.title.startswith("admission")]
    assert action in admission._group_actions
    built = config_from_args(Server, p.parse_args(["--max-new-knob", "3"]), "server")
    assert built.admission.max_new_knob == 3  # type: ignore[attr-defined]
    assert built.admission.max_queued_requests == AdmissionConfig().max_queued_requests


def test_unset_flags_give_only_what_was_passed() -> None:
    """The gateway's way: a config file holds the rest, so flags not passed say nothing."""
    p = _parser(Outer, unset=True)
    assert overrides_from_args(Outer, p.parse_args([])) == {}
    args = p.parse_args(["--no-fast", "--in-delay-ms", "10"])
    assert overrides_from_args(Outer, args) == {"fast": False, "inner": {"delay_s": 0.01}}


def test_fields_that_cannot_be_flags_are_refused() -> None:
    @dataclass(frozen=True)
    class OnByDefault:
        on: bool = field(default=True, metadata=flag())  # a switch could only set it True

    @dataclass(frozen=True)
    class Mapping:
        table: dict[str, int] = field(default_factory=dict, metadata=flag())  # no parser

    for cls in (OnByDefault, Mapping):
        with pytest.raises(TypeError):
            add_config_args(argparse.ArgumentParser(), cls, "x")
